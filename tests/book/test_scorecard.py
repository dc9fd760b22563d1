"""Tests of the scorecard's assembly (nopelib.book.scorecard): the chapters' defaults it judges,
one row per reading with its own verdict, the model each row names and whether it lies in
the paper's grid, untested rows, the order of the trained profiles, and the HTML list of
verdicts. The whole page runs in the book build and under nbval."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from nopelib.book import beyond_rows, chapters, score_rows, scorecard
from nopelib.core.chapter import ChapterSpec
from nopelib.core.model import GPTConfig
from nopelib.rules import beyond_claims, claims, init_claims
from nopelib.training.profiles import PROFILES

SPEC = scorecard.SPECS[init_claims.LAYER1]
BASE = score_rows.model_of(GPTConfig())


# ---------------------------------------------------------------------------------------------
# the model of a row


def test_model_labels_name_layers_width_and_the_token_embeddings_sigma():
    assert score_rows.model_label(GPTConfig()) == "6 layers × 384 wide, token-embedding σ 0.02"
    assert (score_rows.model_label(PROFILES["study"].model)
            == "4 layers × 96 wide, token-embedding σ 0.002")
    every = GPTConfig(init_target="all", init_std=0.2)
    assert score_rows.model_label(every) == "6 layers × 384 wide, σ 0.2 on every weight"
    assert (score_rows.model_label(GPTConfig(init_mean=4.0))
            == "6 layers × 384 wide, token-embedding mean 4, σ 0.02")
    assert score_rows.model_label(GPTConfig(causal=False)).endswith(", bidirectional")
    assert "learned position encoding" in score_rows.model_label(
        GPTConfig(pos_encoding="learned"))
    # several configurations: each field's range
    grid = [GPTConfig(n_layer=L, n_embd=W) for L in (6, 12, 24) for W in (192, 384, 768)]
    assert (score_rows.model_label(grid)
            == "6–24 layers × 192–768 wide, token-embedding σ 0.02")
    sigmas = [GPTConfig(init_mean=m, init_std=s) for m in (0.0, 8.0) for s in (0.002, 0.02)]
    assert (score_rows.model_label(sigmas)
            == "6 layers × 384 wide, token-embedding mean 0–8, σ 0.002–0.02")
    with pytest.raises(ValueError, match="mix init targets"):
        score_rows.model_label([GPTConfig(), every])
    with pytest.raises(ValueError, match="no configuration"):
        score_rows.model_label([])


def test_the_paper_grid_is_6_to_24_layers_by_192_to_768_wide_nope_and_causal():
    inside = [GPTConfig(), GPTConfig(n_layer=24, n_embd=768), GPTConfig(n_layer=6, n_embd=192),
              GPTConfig(init_std=0.2, init_target="all")]  # the init is not the grid's
    outside = [PROFILES["study"].model, GPTConfig(n_layer=5), GPTConfig(n_layer=25),
               GPTConfig(n_embd=186), GPTConfig(n_embd=774), GPTConfig(causal=False),
               GPTConfig(pos_encoding="learned")]
    assert [score_rows.in_paper_grid(c) for c in inside] == [True] * len(inside)
    assert [score_rows.in_paper_grid(c) for c in outside] == [False] * len(outside)
    assert score_rows.in_paper_grid(PROFILES["paper_study"].model)
    assert score_rows.grid_status([True, True]) == "inside the paper's grid"
    assert score_rows.grid_status([False]) == "outside the paper's grid"
    assert score_rows.grid_status([True, False]) == "partly inside the paper's grid"
    with pytest.raises(ValueError):
        score_rows.grid_status([])


def test_the_long_study_models_count_a_sliding_window_as_outside_the_grid():
    runs = [dict(n_embd=w, window=win) for w, win in ((192, None), (768, None), (384, 64))]
    models = beyond_rows._long_models(runs, GPTConfig())
    assert models["global"] == ("6 layers × 192–768 wide, token-embedding σ 0.02, global "
                                "attention", scorecard.INSIDE)
    assert models["window"] == ("6 layers × 384 wide, token-embedding σ 0.02, sliding window "
                                "64", scorecard.OUTSIDE)
    assert models["all"][1] == scorecard.PARTLY and "sliding window 64" in models["all"][0]


# ---------------------------------------------------------------------------------------------
# rows


def _table(verdicts: list[str], means: list[float], reading: str = "layer 1 at least 0.8",
           claim: str = SPEC[0]) -> pd.DataFrame:
    return pd.DataFrame(dict(claim=claim, reading=reading,
                             group=[f"g{i}" for i in range(len(verdicts))], verdict=verdicts,
                             mean=means, lo=[m - 0.05 for m in means],
                             hi=[m + 0.05 for m in means], bound=0.8, above=True, n=5,
                             m=4, holds_level=0.95, fails_level=1 - 0.05 / 4, weakest_layer=1,
                             tests=1))


def test_a_row_reads_its_groups_and_names_the_weakest():
    row = scorecard.make_row(SPEC, "layer 1 at least 0.8", BASE,
                         _table(["holds", "fails"], [0.95, 0.6]), "group", "live")
    assert row["verdict"] == "partly" and row["reading"] == "layer 1 at least 0.8"
    assert row["model"] == "6 layers × 384 wide, token-embedding σ 0.02"
    assert row["grid"] == scorecard.INSIDE
    assert "g1, layer 1, 0.600 [0.550, 0.650]" in row["measured"]
    assert "5 seeds" in row["evidence"] and "Bonferroni over 4 tests" in row["evidence"]
    assert row["section"] == ('<a href="random_init.html#the-adjacency-score-per-layer">'
                              "random init</a>")
    assert list(row["groups"].columns) == list(score_rows.GROUP_COLUMNS)
    held = scorecard.make_row(SPEC, "layer 1 at least 0.8", BASE,
                          _table(["holds"] * 3, [0.9] * 3), "group", "live")
    assert held["verdict"] == "replicates"
    undecided = scorecard.make_row(SPEC, "layer 1 at least 0.8", BASE,
                               _table(["holds", "cannot tell"], [0.9, 0.8]), "group", "live")
    assert undecided["verdict"] == "cannot tell"
    whole = _table(["holds"], [0.9]).assign(group="512 chars", weakest_layer=-1)
    assert "nearest to failing: 512 chars, 0.900" in scorecard.make_row(
        SPEC, "layer 1 at least 0.8", BASE, whole, "group", "live")["measured"]
    probe = _table(["holds"], [0.9]).assign(group="random init, layer 2")
    named = scorecard.make_row(SPEC, "layer 1 at least 0.8", BASE, probe, "group",
                           "live")["measured"]
    assert "random init, layer 2, 0.900" in named and named.count("layer") == 1
    empty = scorecard.make_row(SPEC, "r", BASE, None, "task", "committed", "no study")
    assert empty["verdict"] == "untested" and empty["measured"] == "no study"
    assert empty["groups"] is None
    # what an untested row says is not tacked onto a judged one; a suffix is
    judged = scorecard.make_row(SPEC, "layer 1 at least 0.8", BASE, _table(["holds"], [0.9]),
                                "group", "live", "no study", suffix="; one task left out")
    assert "no study" not in judged["measured"]
    assert judged["measured"].endswith("(the claim: > 0.8); one task left out")


def test_a_row_is_one_reading_never_two_anded():
    both = pd.concat([_table(["fails"], [0.6], "a"), _table(["holds"], [0.9], "b")])
    with pytest.raises(ValueError, match="a row is one reading"):
        scorecard.make_row(SPEC, "a", BASE, both, "group", "live")


WEAKEN = "4: later layers weaken it"
READINGS = {reading: n for n, (claim, reading) in enumerate(claims.TRAINED_CLAIMS)}


def _fake_study(monkeypatch, verdicts: dict[str, list[str]], studied=("paper_study", "study"),
                held: dict[str, int] | None = None, stale=(), no_margin=()):
    """A committed study of the profiles in ``studied`` judged on addition and reversal,
    whose claim table gives each reading of claims.TRAINED_CLAIMS the per-task verdicts in
    ``verdicts`` (default: holds on both); ``held``: seeds in per task of the chapter's
    tasks (default: all of them in for addition and reversal, none for the others); the
    tasks of ``stale`` have an outdated file, those of ``no_margin`` are learned late."""
    tasks = ["addition", "reversal"]
    held = held or {t: len(PROFILES["study"].seeds) for t in tasks}
    files = {t: {"runs": [{"seed": s} for s in range(k)]} for t, k in held.items() if k}
    rows = [dict(claim=claim, reading=reading, task=task, verdict=v, tests=1, n=5,
                 weakest_layer=4, mean=0.1, lo=0.05 if v == "holds" else -0.2,
                 hi=0.2 if v != "fails" else -0.05, bound=0.0, above=True, m=8,
                 holds_level=0.95, fails_level=1 - 0.05 / 8)
            for claim, reading in claims.TRAINED_CLAIMS
            for task, v in zip(tasks, verdicts.get(reading, ["holds", "holds"]))]
    table = pd.DataFrame(rows)
    monkeypatch.setattr(score_rows.committed, "load_study", lambda profile, t: (
        ({t_: files[t_] for t_ in t if t_ in files}, []) if profile in studied
        else ({}, list(t))))
    monkeypatch.setattr(score_rows.committed, "stale_tasks",
                        lambda profile, t: [t_ for t_ in t if t_ in stale])
    monkeypatch.setattr(score_rows.trained_tables, "study_table", lambda docs: None)
    monkeypatch.setattr(score_rows.trained_tables, "study_accuracy", lambda table, n, **kw: (
        pd.DataFrame({"seeds": [held[t] for t in files], "learned": True,
                      "with margin": [t not in no_margin for t in files],
                      "complete": [held[t] >= kw["n_seeds"] for t in files]},
                     index=list(files))))
    monkeypatch.setattr(score_rows.trained_tables, "trained_verdicts", lambda docs, acc: (None, table))
    return tasks


def test_each_reading_of_a_claim_is_its_own_row_with_its_own_verdict(monkeypatch):
    below_layer_1, below_init, gradual = (r for c, r in claims.TRAINED_CLAIMS if c == WEAKEN)
    tasks = _fake_study(monkeypatch, {below_layer_1: ["fails", "fails"],
                                      below_init: ["holds", "holds"],
                                      gradual: ["cannot tell", "holds"]})
    rows, info = scorecard.trained_rows("study", tasks)
    assert [(r["claim"], r["reading"]) for r in rows] == list(claims.TRAINED_CLAIMS)
    weaken = {r["reading"]: r["verdict"] for r in rows if r["claim"] == WEAKEN}
    assert weaken == {below_layer_1: "fails", below_init: "replicates",
                      gradual: "cannot tell"}
    assert info["judged"] == tasks
    # the groups behind each row are that reading's only, named with the profile
    groups = next(r["groups"] for r in rows if r["reading"] == below_init)
    assert set(groups.reading) == {below_init}
    assert list(groups.group) == ["addition (study)", "reversal (study)"]


def test_a_task_still_training_keeps_a_claim_about_every_task_from_replicating(monkeypatch):
    below_layer_1 = next(r for c, r in claims.TRAINED_CLAIMS if c == WEAKEN)
    # addition and reversal judged; ordering has 2 of 5 seeds in, indexing none
    held = {"addition": 5, "reversal": 5, "ordering": 2}
    _fake_study(monkeypatch, {below_layer_1: ["fails", "holds"]}, held=held)
    rows, info = scorecard.trained_rows("paper_study", ["addition", "reversal", "ordering",
                                                        "indexing"])
    assert info["in_flight"] == ["ordering (still training: 2 of 5 seeds in)",
                                 "indexing (still training: 0 of 5 seeds in)"]
    verdicts = {r["reading"]: r["verdict"] for r in rows}
    # holding on every judged task is not replicating while two tasks are out ...
    assert {v for k, v in verdicts.items() if k != below_layer_1} == {"cannot tell"}
    # ... and a reading that fails on a judged task says so, whatever the others will say,
    # marked provisional: the tests still to come widen the correction "fails" passed
    assert verdicts[below_layer_1] == "partly"
    assert all(r["in_flight"] == 2 for r in rows)
    assert ("holds on 2 of 2 tasks; cannot tell yet on 2 more tasks: ordering (still "
            "training: 2 of 5 seeds in), indexing (still training: 0 of 5 seeds in)"
            ) in rows[0]["measured"]
    provisional = {r["reading"] for r in rows if "provisional" in r["measured"]}
    assert provisional == {below_layer_1}
    card = pd.DataFrame(rows, columns=list(scorecard.COLUMNS))
    counts = scorecard.summary(card)
    assert counts["n_cannot_tell"] == counts["n_in_flight"] == len(rows) - 1
    assert counts["n_provisional"] == 1
    assert (counts["n_results"], counts["n_claims"]) == (2, 3)  # results 2 and 4
    # all in: the same verdicts replicate, and nothing waits or is provisional
    _fake_study(monkeypatch, {below_layer_1: ["fails", "holds"]})
    rows, info = scorecard.trained_rows("paper_study", ["addition", "reversal"])
    assert info["in_flight"] == [] and {r["in_flight"] for r in rows} == {0}
    assert sorted(r["verdict"] for r in rows) == ["partly"] + ["replicates"] * (len(rows) - 1)
    assert not any("provisional" in r["measured"] for r in rows)
    counts = scorecard.summary(pd.DataFrame(rows, columns=list(scorecard.COLUMNS)))
    assert counts["n_in_flight"] == counts["n_provisional"] == 0


def test_a_stale_task_waits_and_a_task_learned_late_is_named_not_judged(monkeypatch):
    # all of ordering's seeds are in but late for the margin rule: the rule judges the
    # others without it; indexing's file is stale: cannot tell until it is retrained
    held = {"addition": 5, "reversal": 5, "ordering": 5}
    _fake_study(monkeypatch, {}, held=held, stale=("indexing",), no_margin=("ordering",))
    rows, info = scorecard.trained_rows("paper_study", ["addition", "reversal", "ordering",
                                                        "indexing"])
    assert info["judged"] == ["addition", "reversal"]
    assert info["in_flight"] == ["indexing (stale: trained under an earlier profile)"]
    assert {r["verdict"] for r in rows} == {"cannot tell"}
    assert all("not judged: ordering (not learned with margin)" in r["measured"]
               for r in rows)


def test_trained_rows_name_the_profiles_model_and_its_place_in_the_grid(monkeypatch):
    tasks = _fake_study(monkeypatch, {}, studied=("study",))
    small, _ = scorecard.trained_rows("study", tasks)
    assert {r["model"] for r in small} == {
        "4 layers × 96 wide, token-embedding σ 0.002, trained (study profile)"}
    assert {r["grid"] for r in small} == {scorecard.OUTSIDE}
    paper, info = scorecard.trained_rows("paper_study", tasks)
    assert len(paper) == len(claims.TRAINED_CLAIMS)
    assert {(r["verdict"], r["measured"], r["grid"]) for r in paper} == {
        ("untested", score_rows.NOT_TRAINED, scorecard.INSIDE)}
    assert paper[0]["model"].startswith("6 layers × 384 wide, token-embedding σ 0.02")
    assert info["judged"] == [] and info["note"] == score_rows.NOT_TRAINED


def test_the_scorecard_puts_the_paper_models_rows_first_and_refs_each_reading(monkeypatch):
    tasks = _fake_study(monkeypatch, {}, studied=("study",))
    trained = chapters.TRAINED
    monkeypatch.setattr(chapters, "TRAINED", ChapterSpec(
        "trained", trained.rules, {**trained.defaults, "tasks": tasks}))
    monkeypatch.setattr(scorecard, "init_studies", lambda p: {})
    monkeypatch.setattr(scorecard, "init_rows", lambda ev, p: [])
    monkeypatch.setattr(scorecard, "beyond_rows", lambda ev, p: [])
    monkeypatch.setattr(scorecard, "long_rows", lambda: [])
    monkeypatch.setattr(scorecard, "text_rows", lambda: [])
    monkeypatch.setattr(scorecard, "length_rows", lambda: [])
    monkeypatch.setattr(scorecard, "probe_rows", lambda pp, studies: [
        scorecard.make_row(scorecard.SPECS[init_claims.PROBE_TRAINED], score_rows.PROBE_READING, s["model"],
                       None, "group", "e", s["note"] or "stub") for s in studies])
    card, groups = scorecard.scorecard(("paper_study", "study", "paper_study"))
    assert list(card.columns) == list(scorecard.COLUMNS)
    after = card[card.claim == "2: the pattern holds after training"]
    assert list(after.verdict) == ["untested", "untested", "replicates", "replicates"]
    assert list(after.grid) == [scorecard.INSIDE] * 2 + [scorecard.OUTSIDE] * 2
    assert list(after.ref) == ["2a", "2b", "2a", "2b"]  # a reading's ref, whatever model
    assert list(card[card.claim == "5: trained"].grid) == [scorecard.INSIDE, scorecard.OUTSIDE]
    assert list(card.ref)[-1] == "6" and card.verdict.iloc[-1] == "untested"
    assert set(groups.claim) == {"2a: the pattern holds after training",
                                 "2b: the pattern holds after training",
                                 "4a: the first layers keep it", "4b: later layers weaken it",
                                 "4c: later layers weaken it", "4d: later layers weaken it"}
    with pytest.raises(ValueError, match="profiles"):
        scorecard.scorecard(("no_such_profile",))


def test_refs_letter_the_readings_that_share_a_number():
    rows = [dict(claim="1: a", reading="x"), dict(claim="2: b", reading="y"),
            dict(claim="2: b", reading="z"), dict(claim="2: b", reading="y"),
            dict(claim="2: c", reading="y"), dict(claim="beyond: d", reading="w"),
            dict(claim="beyond: e", reading="w")]
    assert scorecard._refs(rows) == {("1: a", "x"): "1", ("2: b", "y"): "2a",
                                     ("2: b", "z"): "2b", ("2: c", "y"): "2c",
                                     ("beyond: d", "w"): "beyond a",
                                     ("beyond: e", "w"): "beyond b"}


def test_the_rows_name_the_claims_of_the_rules():
    labels = ({c for c, _ in init_claims.INIT_CLAIMS} | {c for c, _ in claims.TRAINED_CLAIMS})
    numbered = [c for c, *_ in scorecard.PAPER_ROWS if not c.startswith(("5", "6"))]
    assert set(numbered) == labels
    assert {c.split(":")[0] for c, *_ in scorecard.PAPER_ROWS} == {str(n) for n in range(1, 7)}


def test_long_rows_are_untested_without_the_committed_study(monkeypatch):
    monkeypatch.setattr(beyond_rows.results, "load_all", lambda kind: {})
    rows = scorecard.long_rows()
    assert [(r["claim"], r["reading"]) for r in rows] == list(beyond_claims.LONG_CLAIMS)
    assert all(r["verdict"] == "untested" and "long_sequences.html#" in r["section"]
               and r["model"] for r in rows)


# ---------------------------------------------------------------------------------------------
# the page


def _card(verdicts: list[str]) -> pd.DataFrame:
    rows = [dict(ref=f"{i + 1}", claim=f"{i + 1}: claim <{i}>", reading="r & s",
                 model="4 layers × 96 wide", grid=scorecard.OUTSIDE, paper="σ <= 0.02",
                 measured="a < b", verdict=v, evidence="e & f",
                 section='<a href="random_init.html#x">random init</a>', in_flight=0)
            for i, v in enumerate(verdicts)]
    rows.append(dict(rows[0], ref="beyond", claim="beyond: <i>x</i>", grid=scorecard.INSIDE))
    return pd.DataFrame(rows, columns=list(scorecard.COLUMNS))


def test_the_html_is_a_badge_and_a_folded_details_per_row():
    card = _card(list(scorecard.VERDICTS))
    html = scorecard.to_html(card)
    assert html.count('<span class="sc-badge">') == len(card)
    assert html.count("<details ") == html.count("</details>") == len(card)
    assert html.count("<summary>") == len(card)
    classes = re.findall(r'<details class="sc-row (sc-[a-z-]+)">', html)
    assert classes == ["sc-replicates", "sc-partly", "sc-fails", "sc-cannot-tell",
                       "sc-untested", "sc-replicates"]
    badges = re.findall(r'<span class="sc-badge">([^<]*)</span>', html)
    assert badges == list(card.verdict)
    # each verdict has its colour in the page's own CSS, no stylesheet to fetch
    for cls in set(classes):
        assert re.search(rf"\.{cls} \{{ --sc-colour: #[0-9a-f]{{6}}; \}}", html), cls
    assert "http" not in html.split("</style>")[0]
    # the model and its grid words in the summary; measured, evidence and link folded
    summary = html.split("<summary>")[1].split("</summary>")[0]
    assert "4 layers × 96 wide" in summary and "sc-grid-outside" in summary
    assert "outside the paper&#x27;s grid" in summary and "a &lt; b" not in summary
    body = html.split("</summary>")[1].split("</details>")[0]
    assert "a &lt; b" in body and "e &amp; f" in body and '<a href="random_init.html#x">' in body
    assert html.index("The paper&#x27;s results") < html.index("Beyond the paper")
    assert html.count('class="sc-part"') == 2


def test_the_html_escapes_every_text_but_the_link():
    html = scorecard.to_html(_card(["fails"]))
    assert "claim &lt;0&gt;" in html and "&lt;i&gt;x&lt;/i&gt;" in html
    assert "r &amp; s" in html and "σ &lt;= 0.02" in html
    assert "<i>" not in html and "<0>" not in html
    with pytest.raises(ValueError, match="not one of"):
        scorecard.to_html(_card(["holds"]))  # a test's word, not the scorecard's
    with pytest.raises(ValueError, match="lacks columns"):
        scorecard.to_html(_card(["fails"]).drop(columns="grid"))


def test_the_margins_figure_puts_the_claims_side_to_the_right():
    groups = pd.DataFrame(dict(
        claim=["1: a", "3: b"], group=["base model", "mean 0, sigma 0.2"], reading="r",
        weakest_layer=[1, 2], mean=[0.9, 0.05], lo=[0.85, 0.0], hi=[0.95, 0.12],
        bound=[0.8, 0.1], above=[True, False], verdict=["holds", "cannot tell"]))
    fig = scorecard.claim_margins(groups, "t")
    held, undecided = fig.data
    assert held.name == "holds" and held.x[0] == pytest.approx(0.1)
    assert held.error_x.array[0] == pytest.approx(0.05)
    # "below 0.1": 0.05 is 0.05 on the claim's side; its interval runs from -0.02 to 0.1
    assert undecided.x[0] == pytest.approx(0.05)
    assert undecided.error_x.arrayminus[0] == pytest.approx(0.07)
    assert undecided.y[0] == "3 · mean 0, sigma 0.2 · layer 2"
    whole = groups.assign(weakest_layer=[-1, 2], group=["512 chars", "random init, layer 2"])
    assert sorted(y for t in scorecard.claim_margins(whole, "t").data for y in t.y) == [
        "1 · 512 chars", "3 · random init, layer 2"]  # a whole-model test names no layer


def test_the_provenance_box_names_what_the_page_depends_on():
    from nopelib.results import files as results
    from nopelib.book import viz

    fields = results.page_provenance(profile="study", seeds=[0, 1])
    assert {"commit", "built", "torch", "numpy", "CPU kernels", "GPU"} <= set(fields)
    html = viz.provenance_box({**fields, "note": "<b>"})
    assert html.startswith("<details") and "&lt;b&gt;" in html and "seeds" in html


def test_a_trained_study_in_flight_is_not_judged_on_the_scorecard(monkeypatch):
    from nopelib.results import trained_files
    docs, _ = trained_files.load_study("study", ["reversal"])
    partial = {"reversal": {**docs["reversal"], "runs": docs["reversal"]["runs"][:2]}}
    monkeypatch.setattr(score_rows.committed, "load_study", lambda profile, tasks: (partial, []))
    rows = scorecard.trained_rows("study", ["reversal"])[0]
    assert rows and all(r["verdict"] == "untested" for r in rows)
    assert "no task judged yet: reversal (still training: 2 of 5 seeds in)" in \
        rows[0]["measured"]


def test_text_rows_judge_the_initialisation_live_and_the_trained_on_the_committed_study(
        monkeypatch):
    from nopelib.results import files as results
    from nopelib.studies import text_study

    seeds, lengths = [0, 1, 2], [32, 64, 128, 256, 512, 1024]
    frame = pd.DataFrame([dict(encoding="none", stage="init", seed=s, layer=layer, length=n,
                               score=(0.9 if layer else 0.5) + 0.01 * s)
                          for s in seeds for n in lengths for layer in range(5)])
    monkeypatch.setattr(chapters, "memo", lambda fn, *args, **kw: fn(*args, **kw))
    monkeypatch.setattr(text_study, "init_scores", lambda profile, s, n: frame)
    rows = scorecard.text_rows()
    assert [r["claim"] for r in rows] == [c for c, _ in beyond_claims.TEXT_CLAIMS]
    assert all(r["claim"].startswith("beyond") and "text.html#" in r["section"] for r in rows)
    assert rows[0]["verdict"] == "replicates" and "0.9" in rows[0]["measured"]
    committed = results.load_all("text")
    if "text_text.json" in committed:  # the trained readings are judged on it
        assert "untested" not in {r["verdict"] for r in rows[1:]}
        assert all("text_text.json" in r["evidence"] for r in rows[1:])
        assert not any("no committed" in r["measured"] or "not judged" in r["measured"]
                       for r in rows[1:])
    # without a committed study, or with too few seeds, the trained readings are untested
    monkeypatch.setattr(results, "load_all", lambda kind: {})
    rows = scorecard.text_rows()
    assert {r["verdict"] for r in rows[1:]} == {"untested"}
    assert "no committed text study" in rows[1]["measured"]
    if "text_text.json" in committed:
        doc = committed["text_text.json"]
        few = {**doc, "runs": [r for r in doc["runs"] if r["seed"] == 0]}
        monkeypatch.setattr(results, "load_all", lambda kind: {"text_text.json": few})
        rows = scorecard.text_rows()
        assert {r["verdict"] for r in rows[1:]} == {"untested"}
        assert "not judged" in rows[1]["measured"]

def test_the_tally_counts_each_model_apart_in_the_card_s_order():
    card = pd.DataFrame({"claim": ["2: a", "2: a", "4: b", "beyond: c", "4: b"],
                         "model": ["6 x 384", "4 x 96", "6 x 384", "6 x 384", "4 x 96"],
                         "verdict": ["replicates", "fails", "cannot tell", "fails",
                                     "fails"]})
    counts = scorecard.tally(card)
    assert list(counts.index) == ["6 x 384", "4 x 96"]  # beyond rows not counted
    assert counts.loc["6 x 384", "replicates"] == 1 and counts.loc["4 x 96", "fails"] == 2
    assert counts["rows"].tolist() == [2, 2]
    assert scorecard.tally_text(counts, "4 x 96") == "2 fail (of 2 rows)"
    one = scorecard.tally(card.iloc[:1])
    assert scorecard.tally_text(one, "6 x 384") == "1 replicate (of 1 row)"
    assert scorecard.tally_text(counts, "6 x 384") == ("1 replicate, 1 cannot tell "
                                                       "(of 2 rows)")
