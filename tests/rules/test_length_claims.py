"""The rule for text past its training length (nopelib.rules.length_claims), and its reading
under two CPU kernel sets (length_kernels), on tables whose verdicts are known by
construction."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from nopelib.rules import length_claims as lc
from nopelib.rules import length_kernels as lk

SEEDS = (0, 1, 2)
BASELINE = 4.36


def tables(nope_rise: float = 0.5, rope_rise: float = 2.0, alibi_rise: float = 0.1,
           sharpen_gain: float = 0.2, ordered_past: float = 0.55,
           ordered_within: float = 0.95, bpc_at_context: float = 2.2,
           jitter: float = 0.01) -> tuple[pd.DataFrame, pd.DataFrame]:
    """bpc and states tables: each encoding's rise grows linearly in log2(n / 256)."""
    rng = np.random.default_rng(0)
    rises = {"none": nope_rise, "rope": rope_rise, "alibi": alibi_rise}
    rows = []
    for enc in lc.LENGTH_ENCODINGS:
        for seed in SEEDS:
            for n in lc.LENGTH_LENGTHS:
                if enc == "learned" and n > lc.LENGTH_CONTEXT:
                    continue
                octaves = np.log2(n / lc.LENGTH_CONTEXT)
                bpc = bpc_at_context + rises.get(enc, 0.0) * octaves + jitter * rng.normal()
                sharp = (bpc - sharpen_gain * octaves + jitter * rng.normal()
                         if enc == "none" else np.nan)
                rows.append(dict(encoding=enc, seed=seed, length=n, bpc=bpc,
                                 sharpened=sharp))
    states = []
    for seed in SEEDS:
        for n in lc.LENGTH_LENGTHS:
            for layer in range(5):
                ordered = ordered_within if n <= lc.LENGTH_CONTEXT else ordered_past
                states.append(dict(seed=seed, layer=layer, length=n,
                                   score=0.9 + jitter * rng.normal(),
                                   ordered=ordered + jitter * rng.normal()))
    return pd.DataFrame(rows), pd.DataFrame(states)


def verdicts(table: pd.DataFrame, i: int) -> set[str]:
    return set(table.loc[table.claim == lc.LENGTH_CLAIMS[i][0], "verdict"])


def test_a_clear_case_reads_as_built() -> None:
    table = lc.length_claims(*tables(), BASELINE)
    assert verdicts(table, 0) == {"holds"}  # NoPE's loss rises
    assert verdicts(table, 1) == {"holds"}  # RoPE rises more
    assert verdicts(table, 2) == {"fails"}  # ALiBi rises less than NoPE
    assert verdicts(table, 3) == {"holds"}  # the temperature helps
    assert verdicts(table, 4) == {"holds"}
    past = table[(table.claim == lc.LENGTH_CLAIMS[5][0]) & (table.group != "256 chars")]
    assert set(past.verdict) == {"fails"}
    assert set(lc.explains(table).verdict) == {lc.EXPLAINS[0]}


def test_resolved_neighbours_do_not_explain_a_rise() -> None:
    table = lc.length_claims(*tables(ordered_past=0.95), BASELINE)
    assert set(lc.explains(table).verdict) == {lc.EXPLAINS[1]}


def test_unresolved_within_the_context_does_not_explain_either() -> None:
    table = lc.length_claims(*tables(ordered_within=0.55), BASELINE)
    assert set(lc.explains(table).verdict) == {lc.EXPLAINS[1]}


def test_no_rise_is_nothing_to_explain() -> None:
    table = lc.length_claims(*tables(nope_rise=-0.3), BASELINE)
    assert verdicts(table, 0) == {"fails"}
    assert set(lc.explains(table).verdict) == {lc.EXPLAINS[2]}


def test_noise_wider_than_the_effect_cannot_tell() -> None:
    table = lc.length_claims(*tables(nope_rise=0.02, jitter=0.3), BASELINE)
    assert "cannot tell" in verdicts(table, 0)


def test_untrained_models_are_not_judged() -> None:
    table = lc.length_claims(*tables(bpc_at_context=5.0), BASELINE)
    assert set(table.verdict) == {"cannot tell"} and set(table.note) == {"not trained"}
    assert set(lc.explains(table).verdict) == {lc.EXPLAINS[3]}


def test_too_few_or_unmatched_seeds_are_refused() -> None:
    bpc, states = tables()
    with pytest.raises(ValueError, match="seeds per encoding"):
        lc.length_claims(bpc[bpc.seed < 2], states, BASELINE)
    with pytest.raises(ValueError, match="seeds per encoding"):
        lc.length_claims(bpc[~((bpc.encoding == "rope") & (bpc.seed == 2))], states,
                         BASELINE)
    with pytest.raises(ValueError, match="lacks the lengths"):
        lc.length_claims(bpc[bpc.length != 2048], states, BASELINE)
    with pytest.raises(ValueError, match="columns"):
        lc.length_claims(bpc.drop(columns="sharpened"), states, BASELINE)


def test_the_temperature_is_one_within_the_context_and_grows_past_it() -> None:
    t = lc.temperature(2048)
    assert t.shape == (2048,) and np.all(t[:256] == 1.0)
    assert t[511] == pytest.approx(np.log(512) / np.log(256))
    assert np.all(np.diff(t[256:]) > 0)
    with pytest.raises(ValueError, match="T=0"):
        lc.temperature(0)


# under two CPU kernel sets (length_kernels): a verdict stands where both give it

def test_agreeing_sets_keep_every_verdict() -> None:
    bpc, states = tables()
    native = lc.length_claims(bpc, states, BASELINE)
    # other kernels: other last bits, far inside the rule's margins here
    noise = np.random.default_rng(1).normal(0, 1e-4, len(bpc))
    other = lc.length_claims(bpc.assign(bpc=bpc.bpc + noise), states, BASELINE)
    both = lk.across_kernels(native, other)
    assert set(both.kernels) == {"agree"}
    assert list(both.verdict) == list(native.verdict)
    assert list(both[["lo", "hi"]].values.ravel()) == list(native[["lo", "hi"]].values.ravel())


def test_a_verdict_the_sets_differ_on_is_withdrawn() -> None:
    # natively RoPE rises more than NoPE (holds); in the rerun less (fails)
    native = lc.length_claims(*tables(rope_rise=2.0), BASELINE)
    other = lc.length_claims(*tables(rope_rise=0.1), BASELINE)
    both = lk.across_kernels(native, other)
    rope = both[both.claim == lc.LENGTH_CLAIMS[1][0]]
    assert set(rope.verdict_native) == {"holds"} and set(rope.verdict_other) == {"fails"}
    assert set(rope.verdict) == {"cannot tell"} and set(rope.kernels) == {"differ"}
    rest = both[both.claim != lc.LENGTH_CLAIMS[1][0]]
    assert (rest.verdict == rest.verdict_native).all()
    # the explanation reads the withdrawn verdicts: nothing rests on one set alone
    assert len(lc.explains(both)) == len(lc.explains(native))


def test_the_rerun_can_withdraw_a_verdict_but_never_give_one() -> None:
    undecided = lc.length_claims(*tables(nope_rise=0.02, jitter=0.3), BASELINE)
    decided = lc.length_claims(*tables(nope_rise=0.5), BASELINE)
    first = lc.LENGTH_CLAIMS[0][0]
    assert "cannot tell" in set(undecided.loc[undecided.claim == first, "verdict"])
    both = lk.across_kernels(undecided, decided)
    kept = both[(both.claim == first) & (both.verdict_native == "cannot tell")]
    assert len(kept) and set(kept.verdict) == {"cannot tell"}


def test_tests_under_one_set_only_are_refused() -> None:
    native = lc.length_claims(*tables(), BASELINE)
    with pytest.raises(ValueError, match="tests differ"):
        lk.across_kernels(native, native[native.group != "2048 chars"])
    assert isinstance(lk.across_kernels(native, native), pd.DataFrame)
