"""Tests of the claim rules: t intervals, the Bonferroni family, verdicts, the learnedness
margin, and the refusal to judge a claim on nothing."""

import numpy as np
import pandas as pd
import pytest

from nopelib.core import stats
from nopelib.rules import beyond_claims, claims, init_claims


def test_t_interval_matches_the_textbook():
    # n = 3, mean 2, sd 1: half-width t_{0.975, 2} / sqrt(3) = 4.3027 / 1.7321
    mean, lo, hi = stats.t_interval([1.0, 2.0, 3.0], 0.95)
    assert mean == 2.0 and hi - mean == pytest.approx(2.4841, abs=1e-4)
    assert mean - lo == pytest.approx(hi - mean)
    # wider at a higher level and with fewer units
    assert stats.t_interval([1.0, 2.0, 3.0], 0.99)[2] > hi
    assert np.isnan(stats.t_interval([1.0], 0.95)[1])
    with pytest.raises(ValueError, match="level="):
        stats.t_interval([1.0, 2.0], 1.5)
    with pytest.raises(ValueError, match="finite"):
        stats.t_interval([1.0, float("nan")], 0.95)


def test_test_verdicts():
    assert claims.test_verdict(0.6, 0.9, 0.5, above=True) == "holds"
    assert claims.test_verdict(0.1, 0.4, 0.5, above=True) == "fails"
    assert claims.test_verdict(0.4, 0.6, 0.5, above=True) == "cannot tell"
    assert claims.test_verdict(-0.3, -0.1, 0.0, above=False) == "holds"
    assert claims.test_verdict(float("nan"), float("nan"), 0.0, above=True) == "cannot tell"
    assert claims.combine(["holds", "holds"]) == "holds"
    assert claims.combine(["holds", "cannot tell"]) == "cannot tell"
    assert claims.combine(["holds", "fails", "cannot tell"]) == "fails"


def test_family_is_corrected_on_the_fails_side_only():
    rows = [dict(test=t, bound=0.0, above=True, unit=u, value=v)
            for t in range(4) for u, v in enumerate([0.9, 1.0, 1.1])]
    one = claims.judge(pd.DataFrame(rows[:3]))
    four = claims.judge(pd.DataFrame(rows))
    assert one["holds_level"].iloc[0] == one["fails_level"].iloc[0] == pytest.approx(0.95)
    np.testing.assert_allclose(four["holds_level"], 0.95)  # intersection-union: no correction
    np.testing.assert_allclose(four["fails_level"], 1 - 0.05 / 4)  # Bonferroni
    assert (four["m"] == 4).all()
    # the claim's side (lo, for "above") is the same bound; the other side is wider
    assert four["lo"].iloc[0] == pytest.approx(one["lo"].iloc[0])
    assert four["hi"].iloc[0] > one["hi"].iloc[0]
    # one-sided at 0.95: t_{0.95, 2} = 2.9200 sd / sqrt(3), sd = 0.1
    assert one["mean"].iloc[0] - one["lo"].iloc[0] == pytest.approx(2.9200 * 0.1 / 3**0.5,
                                                                   abs=1e-4)


def _family(mean: float, sd: float, bound: float, above: bool, m: int, n: int = 5):
    """m identical tests whose n per-unit values have exactly this mean and sd."""
    z = np.linspace(-1, 1, n)
    values = mean + sd * z / z.std(ddof=1)
    return pd.DataFrame([dict(test=t, bound=bound, above=above, unit=u, value=v)
                         for t in range(m) for u, v in enumerate(values)])


def test_side_levels_of_the_two_rule_sets():
    assert claims.side_levels(16) == (0.95, 1 - 0.05 / 16)
    assert claims.side_levels(16, rules="registered") == (1 - 0.05 / 32, 1 - 0.05 / 32)
    with pytest.raises(ValueError, match="rules='bonferroni'.*allowed"):
        claims.side_levels(4, rules="bonferroni")
    with pytest.raises(ValueError, match="m=0"):
        claims.side_levels(0)


def test_a_reading_that_holds_only_under_the_revised_rule():
    # 16 tests, 5 seeds, mean 0.9 and sd 0.05 against "above 0.8": one-sided at 0.95 the bound
    # is 0.9 - 2.132 * 0.0224 = 0.852 > 0.8; two-sided at 1 - 0.05/16 it is 0.9 - 6.4 * 0.0224
    # = 0.757, which used to read "cannot tell"
    tests = _family(0.9, 0.05, 0.8, above=True, m=16)
    revised = claims.judge(tests)
    registered = claims.judge(tests, rules="registered")
    assert (revised.verdict == "holds").all()
    assert (registered.verdict == "cannot tell").all()
    assert (revised.lo > 0.8).all() and (registered.lo < 0.8).all()


def test_a_failing_side_that_must_still_read_cannot_tell():
    # mean 0.75, sd 0.05 against "above 0.8": alone, one-sided at 0.95, the upper bound 0.798
    # is below 0.8 (fails); in a family of 16 the Bonferroni bound reaches past 0.8
    assert (claims.judge(_family(0.75, 0.05, 0.8, above=True, m=1)).verdict == "fails").all()
    assert (claims.judge(_family(0.75, 0.05, 0.8, above=True, m=16)).verdict
            == "cannot tell").all()
    # the same for a claim that says "below": mirror image
    below = claims.judge(_family(0.85, 0.05, 0.8, above=False, m=16))
    assert (below.verdict == "cannot tell").all()
    assert (claims.judge(_family(0.7, 0.05, 0.8, above=False, m=16)).verdict
            == "holds").all()


def test_a_mean_at_the_bound_and_a_single_seed_cannot_tell():
    for rules in claims.RULES:
        assert (claims.judge(_family(0.8, 0.05, 0.8, True, 3), rules=rules).verdict
                == "cannot tell").all()
        one = claims.judge(pd.DataFrame([dict(test=0, bound=0.8, above=True, unit=0,
                                              value=0.99)]), rules=rules)
        assert one.verdict.iloc[0] == "cannot tell" and np.isnan(one.lo.iloc[0])


def test_holds_on_a_group_is_an_intersection():
    # two tests in a group: one clearly above, one undecided -> the group cannot tell
    tests = pd.concat([_family(0.95, 0.02, 0.8, True, 1).assign(test="a"),
                       _family(0.81, 0.05, 0.8, True, 1).assign(test="b")])
    judged = claims.judge(tests)
    assert list(judged.verdict) == ["holds", "cannot tell"]
    assert claims.combine(judged.verdict) == "cannot tell"


def _scores(layer1: float, last: float, seeds: int = 3, noise: float = 0.01) -> np.ndarray:
    rng = np.random.default_rng(0)
    base = np.array([0.6, layer1, 0.85, 0.85, last])
    return base + noise * rng.standard_normal((seeds, 5))  # [seeds, L+1]


def _judge(before: np.ndarray, after: np.ndarray, phase: np.ndarray | None = None):
    phase = after if phase is None else phase
    return claims.claim_table(claims.trained_claims(
        {"reversal": before}, {"reversal": after}, {"reversal": phase}, ["reversal"]))


def test_trained_claims_readings():
    before = _scores(0.85, 0.9)
    strong = _judge(before, _scores(0.95, 0.7))
    assert set(strong["verdict"]) == {"holds"}
    assert len(strong) == len(claims.TRAINED_CLAIMS)
    # a first layer that fell below 0.8 and a last layer above layer 1: both readings fail
    weak = _judge(before, _scores(0.7, 0.95))
    verdicts = dict(zip(weak["reading"], weak["verdict"]))
    assert verdicts["layer 1 at least 0.8 through the learned phase"] == "fails"
    assert verdicts["last layer below layer 1 through the learned phase"] == "fails"
    assert verdicts["last layer below its initialisation through the learned phase"] == "fails"
    # noise the size of the effect: nothing can be told
    noisy = _judge(before, _scores(0.82, 0.8, noise=0.2))
    reading = "last layer below layer 1 through the learned phase"
    assert (noisy.loc[noisy["reading"] == reading, "verdict"] == "cannot tell").all()


def test_keeps_and_weakens_are_read_over_the_learned_phase_not_the_last_step():
    before = _scores(0.85, 0.9)
    # the last step looks strong, the learned phase does not: the phase decides claim 4,
    # the last step claim 2
    table = _judge(before, after=_scores(0.95, 0.7), phase=_scores(0.7, 0.95))
    verdicts = dict(zip(table["reading"], table["verdict"]))
    assert verdicts["layer 1 at least 0.8 through the learned phase"] == "fails"
    assert verdicts["every layer above chance (0.5)"] == "holds"


def test_learned_phase_averages_the_points_after_the_run_was_learned_for_good():
    steps = [100, 200, 300, 400]
    scores = [[0.5, 0.1], [0.5, 0.2], [0.5, 0.6], [0.5, 1.0]]
    phase = claims.learned_phase(steps, [0.1, 0.95, 0.5, 0.99], scores, 400)
    np.testing.assert_allclose(phase, [0.5, 1.0])  # learned for good from step 400 only
    phase = claims.learned_phase(steps, [0.1, 0.95, 0.96, 0.99], scores, 400)
    np.testing.assert_allclose(phase, [0.5, 0.6])
    with pytest.raises(ValueError, match="no learned phase"):
        claims.learned_phase(steps, [0.1] * 4, scores, 400)
    with pytest.raises(ValueError, match="one row per curve step"):
        claims.learned_phase(steps, [0.95] * 4, scores[:2], 400)


def test_trained_claims_refuse_no_task():
    with pytest.raises(ValueError, match="no learned task"):
        claims.trained_claims({}, {}, {}, [])
    with pytest.raises(ValueError, match="one shape"):
        claims.trained_claims({"reversal": np.ones((3, 5))}, {"reversal": np.ones((2, 5))},
                              {"reversal": np.ones((3, 5))}, ["reversal"])


def test_two_seeds_cannot_decide_a_small_effect():
    # at n = 2 a t interval has one degree of freedom: a 0.05 drop with a 0.02 spread is
    # not enough, where the same values at n = 5 are
    two = claims.judge(pd.DataFrame(
        [dict(test=0, bound=0.0, above=True, unit=u, value=v) for u, v in enumerate([0.04, 0.06])]))
    five = claims.judge(pd.DataFrame(
        [dict(test=0, bound=0.0, above=True, unit=u, value=v)
         for u, v in enumerate([0.04, 0.06, 0.05, 0.045, 0.055])]))
    assert two["verdict"].iloc[0] == "cannot tell" and five["verdict"].iloc[0] == "holds"


def test_past_plateau():
    steps = [100, 200, 300, 400]
    assert claims.past_plateau(steps, [0.1, 0.95, 0.97, 1.0], 400) == dict(
        learned_from=200, tail=0.5, with_margin=True)
    # a dip below the line restarts the count; reaching it only at the end is no margin
    late = claims.past_plateau(steps, [0.1, 0.95, 0.5, 0.99], 400)
    assert late["learned_from"] == 400 and not late["with_margin"]
    assert claims.past_plateau(steps, [0.1] * 4, 400)["learned_from"] is None
    with pytest.raises(ValueError, match="one length"):
        claims.past_plateau(steps, [0.1], 400)


def test_probe_claims_average_probe_seeds_per_model():
    rows = []
    for model in range(3):
        for probe_seed in range(4):  # 4 probe seeds per model: still 3 units
            for layer in (0, 1, 2):
                d = -0.1 if layer == 1 else 0.1 if layer == 2 else 0.0
                rows.append(dict(task="reversal", layer=layer, model_seed=model,
                                 seed=probe_seed, d_nrmse=d + 0.01 * model,
                                 d_r=-d + 0.01 * probe_seed))
    out = init_claims.probe_claims(pd.DataFrame(rows), model="model_seed", group="task")
    assert list(out.index.get_level_values("layer")) == [1, 2]  # layer 0 is a control
    assert (out["n"] == 3).all()
    assert out.loc[("reversal", 1), "verdict"] == "cosine"
    assert out.loc[("reversal", 2), "verdict"] == "variance"
    # both metrics at both layers: a family of 4, corrected on the fails side
    assert out["m"].iloc[0] == 4 and out["holds_level"].iloc[0] == pytest.approx(0.95)
    assert out["fails_level"].iloc[0] == pytest.approx(1 - 0.05 / 4)
    with pytest.raises(ValueError, match="no paired"):
        init_claims.probe_claims(pd.DataFrame(rows), model="model_seed", layers=[7])


def _init_frames(rng, layer1=0.95, lift_at_large=0.02, mean_shift=0.0, seeds=5):
    """Stand-ins for the random-init studies: base model per task, the initialisation study
    (embedding reading) and a one-configuration grid, with the given layer-1 score, lift at
    sigma 0.2 and shift of the score at mean 4."""
    def score(layer, extra=0.0):
        return (0.48 if layer == 0 else layer1 + extra) + rng.normal(0, 0.002)
    base = pd.DataFrame([dict(seed=s, task=t, layer=i, score=score(i))
                         for s in range(seeds) for t in ("addition", "reversal")
                         for i in range(3)])
    init = pd.DataFrame([
        dict(init_target="embedding", init_mean=m, init_std=sd, seed=s, layer=i,
             score=(0.48 + (lift_at_large if i else 0) + rng.normal(0, 0.002)) if sd == 0.2
             else score(i, mean_shift if m else 0.0))
        for m in (0.0, 4.0) for sd in (0.02, 0.2) for s in range(seeds) for i in range(3)])
    grid = pd.DataFrame([dict(n_layer=2, n_embd=64, seed=s, layer=i, score=score(i))
                         for s in range(seeds) for i in range(3)])
    return base, init, grid


def test_init_claims_hold_on_the_paper_shape_and_fail_against_it():
    rng = np.random.default_rng(0)
    tests = init_claims.init_claims(*_init_frames(rng))
    table = claims.claim_table(tests, by="group")
    assert set(table.claim) == {c for c, _ in init_claims.INIT_CLAIMS}
    assert (table.verdict == "holds").all(), table
    assert claims.overall(table.verdict) == "replicates"
    # no pattern at layer 1; sigma 0.2 keeps one; the mean moves the score by 0.2
    bad = claims.claim_table(init_claims.init_claims(
        *_init_frames(rng, layer1=0.6, lift_at_large=0.4, mean_shift=0.2)), by="group")
    verdict = bad.groupby("claim").verdict.apply(claims.overall)
    assert verdict["1: layer 1 jumps to 0.8-1.0"] == "fails"
    assert verdict["3: sigma = 0.2 removes it"] == "fails"
    assert verdict["3: the means 0, 4, 8 matter little"] == "fails"
    assert verdict["1: layer 0 is about 0.5"] == "replicates"


def test_init_claims_cannot_tell_from_two_noisy_seeds_and_need_both_sigmas():
    rng = np.random.default_rng(1)
    base, init, grid = _init_frames(rng, layer1=0.8, seeds=2)  # at the bound, noise 0.002
    table = claims.claim_table(init_claims.init_claims(base, init, grid), by="group")
    row = table[table.claim == "1: layer 1 jumps to 0.8-1.0"].iloc[0]
    assert row.verdict == "cannot tell" and row.n == 2
    with pytest.raises(ValueError, match="sigma >= 0.2"):
        init_claims.init_claims(base, init[init.init_std < 0.2], grid)


def test_overall_verdicts():
    assert claims.overall([]) == "untested"
    assert claims.overall(["holds", "holds"]) == "replicates"
    assert claims.overall(["holds", "fails"]) == "partly"
    assert claims.overall(["fails", "cannot tell"]) == "fails"
    assert claims.overall(["holds", "cannot tell"]) == "cannot tell"


def test_long_claims_read_the_longest_length_and_the_farthest_distance():
    seeds, layers = range(4), range(3)
    scores = pd.DataFrame([dict(n_embd=384, window=w, seed=s, length=L, layer=i,
                                score=(0.5 if i == 0 else 0.9 if w else 0.55) + 0.001 * s)
                           for w in (0, 64) for s in seeds for L in (32, 64) for i in layers])
    order = pd.DataFrame([dict(n_embd=384, window=w, seed=s, layer=i, octave=a, d=d,
                               measured=(0.95 if w else 0.5) + 0.001 * s)
                          for w in (0, 64) for s in seeds for i in layers
                          for a in (32, 64) for d in (2, a // 2)])
    tests = beyond_claims.long_claims(scores, order)
    table = claims.claim_table(tests, by="group").set_index(["claim", "group"])
    verdict = table.verdict.unstack("group").loc[[c for c, _ in beyond_claims.LONG_CLAIMS]]
    # the criticism is judged on global attention only, the window as its contrast
    assert list(verdict["384 wide"].iloc[:3]) == ["fails", "fails", "holds"]
    assert list(verdict["384 wide, window 64"]) == ["holds", "holds", np.nan, "holds"]
    assert np.isnan(verdict["384 wide"].iloc[3])
    assert (tests.n == 4).all() and set(tests.layer) == {1, 2}


def test_resolution_agreement_scores_informative_cells_only():
    res = pd.DataFrame(dict(layer=[1, 1, 1, 1, 1, 2], d_lo=[2.0, np.nan, 4.0, 4.0, 3.0, 2.0],
                            d_hi=[8.0, np.nan, np.nan, np.nan, 6.0, 3.0],
                            predicted=[5.0, np.nan, 3.0, np.nan, np.nan, np.nan]))
    # both unresolved, or predicted unresolved against an interval open at the top: nothing
    # is said either way; a finite interval against "unresolved" is a disagreement
    assert list(beyond_claims.resolution_agreement(res)) == [
        "agrees", "uninformative", "disagrees", "uninformative", "disagrees"]


def test_window_min_reads_only_the_first_steps():
    steps, scores = [0, 10, 500, 1000, 1010], [0.84, 0.8, 0.7, 0.65, 0.1]
    assert beyond_claims.window_min(steps, scores) == 0.65  # step 1,010 lies outside
    assert beyond_claims.window_min(steps, scores, until=10) == 0.8
    assert np.isnan(beyond_claims.window_min([2000], [0.1]))
    with pytest.raises(ValueError, match="differ in shape"):
        beyond_claims.window_min([0, 10], [0.5])


def test_first_below_is_the_first_step_under_the_level():
    assert beyond_claims.first_below([0, 10, 20, 30], [0.84, 0.75, 0.69, 0.9]) == 20
    assert beyond_claims.first_below([0, 10], [0.84, 0.75]) is None


@pytest.mark.parametrize("base, ablated, verdict", [
    ({0: 0.4, 1: 0.5, 2: 0.45}, {0: 0.82, 1: 0.85, 2: 0.8}, "explains"),
    ({0: 0.4, 1: 0.5, 2: 0.45}, {0: 0.5, 1: 0.55, 2: 0.3}, "does not explain"),
    ({0: 0.84, 1: 0.8, 2: 0.7}, {0: 0.9, 1: 0.5, 2: 0.9}, "no collapse"),
    # one seed kept its pattern unablated: the collapse itself is not settled
    ({0: 0.4, 1: 0.65, 2: 0.45}, {0: 0.82, 1: 0.85, 2: 0.8}, "cannot tell"),
    # the ablation helps, but one seed dips below KEEPS_AT: neither explains nor refutes
    ({0: 0.4, 1: 0.5, 2: 0.45}, {0: 0.82, 1: 0.7, 2: 0.8}, "cannot tell"),
    ({0: 0.4, 1: 0.5}, {0: 0.82, 1: 0.85}, "cannot tell"),  # two seeds are too few
    ({0: 0.4, 1: 0.5, 2: 0.45}, {0: 0.82, 1: 0.85, 3: 0.8}, "cannot tell"),  # unpaired
    ({0: 0.4, 1: 0.5, 2: float("nan")}, {0: 0.82, 1: 0.85, 2: 0.8}, "cannot tell"),
])
def test_collapse_cause_rule(base, ablated, verdict):
    assert beyond_claims.collapse_cause(base, ablated) == verdict
    assert verdict in beyond_claims.CAUSE_VERDICTS


def test_largest_gap_names_its_step():
    assert beyond_claims.largest_gap([0, 10, 20], [0.8, 0.7, 0.6], [0.8, 0.5, 0.55]) == \
        pytest.approx((0.2, 10))
    with pytest.raises(ValueError, match="one predicted and one measured"):
        beyond_claims.largest_gap([0, 10], [0.8], [0.8])


# ---------------------------------------------------------------------------------------------
# the text readings (beyond_claims.text_claims), on constructed data


def _text_frames(trained_l1: float, beyond_l1: float, last: float, nope_bpc: float,
                 seeds=(0, 1, 2), layers: int = 4):
    rng = np.random.default_rng(0)
    rows = []
    for enc in beyond_claims.TEXT_ENCODINGS:
        for seed in seeds:
            for n in beyond_claims.TEXT_LENGTHS:
                for layer in range(layers + 1):
                    init = 0.5 if layer == 0 else 0.9
                    if layer == 0:
                        after = 0.5
                    elif layer == layers:
                        after = last
                    else:
                        after = trained_l1 if n <= beyond_claims.TEXT_CONTEXT else beyond_l1
                    for stage, v in (("init", init), ("trained", after)):
                        rows.append(dict(encoding=enc, stage=stage, seed=seed, layer=layer,
                                         length=n, score=v + rng.normal(0, 0.01)))
    bpc = pd.DataFrame([dict(encoding=enc, seed=s,
                             test_bpc=(nope_bpc if enc == "none" else 2.0)
                             + rng.normal(0, 0.01))
                        for enc in beyond_claims.TEXT_ENCODINGS for s in seeds])
    return pd.DataFrame(rows), bpc


def _verdicts(table: pd.DataFrame) -> dict[str, str]:
    return {claim: claims.combine(g["verdict"]) for claim, g in table.groupby("claim")}


def test_text_readings_hold_and_fail_where_the_constructed_data_says():
    scores, bpc = _text_frames(trained_l1=0.85, beyond_l1=0.75, last=0.65, nope_bpc=2.2)
    v = _verdicts(beyond_claims.text_claims(scores, bpc, baseline_bpc=4.3))
    assert set(v) == {c for c, _ in beyond_claims.TEXT_CLAIMS}
    assert v == {c: "holds" for c, _ in beyond_claims.TEXT_CLAIMS}
    # a trained layer 1 at chance fails the pattern readings; NoPE cheaper than learned fails
    # "what NoPE pays"; a last layer above layer 1 fails claim 4's reading
    scores, bpc = _text_frames(trained_l1=0.45, beyond_l1=0.45, last=0.7, nope_bpc=1.8)
    v = _verdicts(beyond_claims.text_claims(scores, bpc, baseline_bpc=4.3))
    assert v[beyond_claims.TEXT_CLAIMS[0][0]] == "holds"  # initialisation is untouched
    for k in (1, 2, 4, 5, 6):
        assert v[beyond_claims.TEXT_CLAIMS[k][0]] == "fails", beyond_claims.TEXT_CLAIMS[k][0]


def test_text_readings_of_untrained_models_are_not_judged():
    scores, bpc = _text_frames(trained_l1=0.85, beyond_l1=0.75, last=0.6, nope_bpc=4.5)
    table = beyond_claims.text_claims(scores, bpc, baseline_bpc=4.3)
    judged = table[table.note == ""]
    assert set(judged["claim"]) == {beyond_claims.TEXT_CLAIMS[0][0]}
    skipped = table[table.note == "not trained"]
    assert set(skipped["verdict"]) == {"cannot tell"} and len(skipped["claim"].unique()) == 6
    # a learned-position model that learned nothing leaves "what NoPE pays" unjudged only
    scores, bpc = _text_frames(trained_l1=0.85, beyond_l1=0.75, last=0.65, nope_bpc=2.2)
    bpc.loc[bpc.encoding == "learned", "test_bpc"] = 4.5
    table = beyond_claims.text_claims(scores, bpc, baseline_bpc=4.3)
    assert set(table.loc[table.note == "not trained", "claim"]) == {beyond_claims.TEXT_CLAIMS[6][0]}


def test_the_text_context_splits_within_from_beyond():
    scores, bpc = _text_frames(trained_l1=0.85, beyond_l1=0.45, last=0.65, nope_bpc=2.2)
    at_256 = beyond_claims.text_claims(scores, bpc, baseline_bpc=4.3)
    at_64 = beyond_claims.text_claims(scores, bpc, baseline_bpc=4.3, context=64)
    beyond = beyond_claims.TEXT_CLAIMS[4][0]
    assert set(at_256.loc[at_256.claim == beyond, "group"]) == {"512 chars", "1024 chars"}
    assert len(at_64.loc[at_64.claim == beyond]) == 4  # 128, 256, 512, 1024


def test_text_readings_need_three_seeds_per_encoding():
    scores, bpc = _text_frames(0.85, 0.75, 0.6, 2.2, seeds=(0, 1))
    with pytest.raises(ValueError, match="at least 3"):
        beyond_claims.text_claims(scores, bpc, baseline_bpc=4.3)
    with pytest.raises(ValueError, match="columns"):
        beyond_claims.text_claims(scores.drop(columns="length"), bpc, baseline_bpc=4.3)
    scores, bpc = _text_frames(0.85, 0.75, 0.6, 2.2)
    with pytest.raises(ValueError, match=r"lack the lengths \[1024\]"):
        beyond_claims.text_claims(scores[scores.length != 1024], bpc, baseline_bpc=4.3)
    with pytest.raises(ValueError, match="the same for both"):
        beyond_claims.text_claims(scores, bpc.assign(seed=[0, 1, 2, 0, 1, 3]), baseline_bpc=4.3)


def test_the_text_initialisation_reading_alone_is_the_full_rules_first():
    scores, bpc = _text_frames(trained_l1=0.85, beyond_l1=0.75, last=0.65, nope_bpc=2.2)
    alone = beyond_claims.text_init_claims(scores)
    full = beyond_claims.text_claims(scores, bpc, baseline_bpc=4.3)
    first = full[full.claim == beyond_claims.TEXT_CLAIMS[0][0]].drop(columns="note")
    pd.testing.assert_frame_equal(alone.reset_index(drop=True), first.reset_index(drop=True))
    assert set(alone["verdict"]) == {"holds"}
    with pytest.raises(ValueError, match="at least 3"):
        beyond_claims.text_init_claims(scores[scores.seed < 2])


GRADUAL = claims.TRAINED_CLAIMS[5][1]


def _gradual(phase_mean: list[float], noise: float = 0.005, seeds: int = 5):
    rng = np.random.default_rng(1)
    phase = np.array(phase_mean) + noise * rng.standard_normal((seeds, len(phase_mean)))
    before = np.full_like(phase, 0.9)
    table = _judge(before, phase, phase)
    return table.set_index("reading").loc[GRADUAL]


def test_layer_slope_is_the_least_squares_slope_over_layers_1_to_top():
    scores = np.array([[0.5, 0.9, 0.8, 0.7, 0.1], [0.5, 0.1, 0.2, 0.3, 0.9]])
    assert claims.layer_slope(scores, 3) == pytest.approx([-0.1, 0.1])
    expected = [np.polyfit([1, 2, 3, 4], row[1:], 1)[0] for row in scores]
    assert claims.layer_slope(scores, 4) == pytest.approx(expected)
    with pytest.raises(ValueError, match="top=1"):
        claims.layer_slope(scores, 1)


def test_gradually_holds_on_a_steady_fall_fails_on_a_rise_cannot_tell_on_one_drop():
    # layer 0, then layers 1..4: a steady fall, a steady rise, flat then one drop at the top
    assert _gradual([0.5, 0.95, 0.9, 0.85, 0.8])["verdict"] == "holds"
    assert _gradual([0.5, 0.8, 0.85, 0.9, 0.95])["verdict"] == "fails"
    drop = _gradual([0.5, 0.92, 0.92, 0.92, 0.75])
    # the slope over 1..4 is negative, but over 1..3 it is zero within noise
    assert drop["verdict"] == "cannot tell" and drop["tests"] == 2
    # the paper model's reversal means as committed: flat, then a drop at the last layer
    flat_then_drop = _gradual([0.467, 0.917, 0.926, 0.93, 0.923, 0.913, 0.861], noise=0.02)
    assert flat_then_drop["verdict"] != "holds"


def test_gradually_needs_three_layers():
    two = claims.trained_claims({"reversal": np.full((3, 3), 0.9)},
                                {"reversal": np.full((3, 3), 0.9)},
                                {"reversal": np.full((3, 3), 0.9)}, ["reversal"])
    assert GRADUAL not in set(two["reading"])
    four = claims.trained_claims(*({"reversal": _scores(0.9, 0.8)} for _ in range(3)),
                                 ["reversal"])
    assert sorted(four.loc[four["reading"] == GRADUAL, "layer"]) == [3, 4]


STEPS = list(range(0, 1001, 100))


def _curve(loss_end: float, fall_to: float, fall_at: int = 300) -> tuple:
    """A run's early curve: training loss falling linearly from 3.0 to ``loss_end``, layer 1
    at 0.9 until ``fall_at``, then at ``fall_to``."""
    loss = list(np.linspace(3.0, loss_end, len(STEPS)))
    layer1 = [0.9 if s < fall_at else fall_to for s in STEPS]
    return STEPS, loss, layer1


def test_the_matched_loss_rule_reads_an_ablation_where_it_learned_as_far():
    base = {s: _curve(1.0, 0.4) for s in range(3)}  # falls at 300, loss there 2.4
    kept = {s: _curve(1.0, 0.85) for s in range(3)}
    assert beyond_claims.matched_cause(base, kept) == "explains"
    fell = {s: _curve(1.0, 0.5, fall_at=200) for s in range(3)}
    assert beyond_claims.matched_cause(base, fell) == "does not explain"
    # an ablated model that never learns as far says nothing, however high its layer 1
    stuck = {s: _curve(2.9, 0.95) for s in range(3)}
    assert beyond_claims.matched_cause(base, stuck) == "not matched"
    # falls later than the matched step: at matched loss it still holds the pattern
    late = {s: _curve(1.0, 0.3, fall_at=900) for s in range(3)}
    assert beyond_claims.matched_cause(base, late) == "explains"
    mixed = {0: _curve(1.0, 0.85), 1: _curve(1.0, 0.85), 2: _curve(1.0, 0.5, fall_at=200)}
    assert beyond_claims.matched_cause(base, mixed) == "cannot tell"
    assert beyond_claims.matched_cause({s: _curve(1.0, 0.9) for s in range(3)},
                                       kept) == "no collapse"
    assert beyond_claims.matched_cause({0: base[0], 1: base[1]},
                                       {0: kept[0], 1: kept[1]}) == "cannot tell"
    assert beyond_claims.fall_loss(*base[0]) == (300, pytest.approx(2.4))
    assert beyond_claims.matched_step(STEPS, base[0][1], 2.4 + 1e-9) == 300
