"""The replication at a glance: one row per claim of the paper, then what goes beyond it.

Each row holds the paper's statement, our measurement, the verdict, the evidence behind it and
the section of the book that computes it. Every verdict comes from the rules of
``nopelib.claims`` (the ones the chapters use), applied to the chapters' own studies at the
chapters' default parameters: ``chapter_defaults`` reads them from each chapter's parameters
cell, and the studies come from the same calls through the run and results caches
(``nopelib.memo``), so within one build the scorecard judges the very numbers the chapters
show. A claim with no test yet reads "untested".
"""

from __future__ import annotations

import ast
import json
from html import escape
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd

from nopelib import analysis as an, claims, long_context, results, study
from nopelib.memo import memo
from nopelib.model import GPTConfig
from nopelib.params import Choice
from nopelib.probe import RidgeConfig
from nopelib.probe_study import (mlp_studies, paired_differences, random_studies,
                                 trained_comparison)
from nopelib.profiles import PROFILES
from nopelib.theory_studies import predicted_config_scores, prediction_table

BOOK = Path(__file__).resolve().parents[1] / "book"
CHAPTER_PARAMS = {"profile": Choice(PROFILES)}
# the scorecard's words: claims.overall's over a claim's groups, and "untested"
VERDICTS = ("replicates", "partly", "fails", "cannot tell", "untested")
COLUMNS = ("claim", "paper", "measured", "verdict", "evidence", "section")
# one row per claim and group (task, configuration, layer) behind a scorecard row
GROUP_COLUMNS = ("claim", "group", "reading", "weakest_layer", "mean", "lo", "hi", "bound",
                 "above", "verdict")

# (claim label in nopelib.claims, the paper's statement, chapter page and section anchor)
PAPER_ROWS = (
    ("1: layer 0 is about 0.5", "Layer 0 (the token embeddings) scores about 0.5.",
     "random_init", "the-adjacency-score-per-layer"),
    ("1: layer 1 jumps to 0.8-1.0", "After the first causal attention layer the score jumps "
     "to 0.8-1.0.", "random_init", "the-adjacency-score-per-layer"),
    ("2: the pattern holds at initialisation, every task", "The pattern holds before "
     "training, for every task.", "random_init", "the-adjacency-score-per-layer"),
    ("2: the pattern holds at initialisation, 6-24 layers x 192-768 wide", "It holds for "
     "6-24 layers and 192-768 widths.", "random_init",
     "depth-and-width-predicted-then-measured"),
    ("2: the pattern holds after training", "It holds after training, for every task.",
     "trained", "the-paper-s-claims"),
    ("3: sigma <= 0.02 keeps the pattern", "An initialisation with sigma <= 0.02 keeps it "
     "stable.", "random_init", "the-initialisation-study"),
    ("3: sigma = 0.2 removes it", "At sigma = 0.2 it is gone.", "random_init",
     "the-initialisation-study"),
    ("3: the means 0, 4, 8 matter little", "The means 0, 4 and 8 have little effect.",
     "random_init", "the-initialisation-study"),
    ("4: the first layers keep it", "Trained models keep a strong pattern in the first "
     "layers.", "trained", "the-paper-s-claims"),
    ("4: later layers weaken it", "It weakens in later layers.", "trained",
     "the-paper-s-claims"),
    ("5: random init", "Cosine-similarity features predict position better than variance "
     "features (random initialisation).", "probes",
     "cosine-against-variance-paired-with-the-model-as-the-unit"),
    ("5: random init, the paper's MLP probe", "The same, with the paper's probe (a 4-layer "
     "MLP).", "probes", "the-paper-s-probe-a-4-layer-mlp-beside-the-ridge"),
    ("5: trained", "The same for trained models.", "probes", "trained-models"),
    ("6: beyond ~30 tokens", "A limit the authors admit: sequences of about 30 tokens only.",
     "random_init", "length-beyond-the-paper-s-inputs-with-and-without-repeats"),
)


def chapter_defaults(chapter: str) -> dict[str, object]:
    """The default parameters of a chapter: the values its cell tagged ``parameters``
    assigns (those papermill would override)."""
    cells = json.loads((BOOK / f"{chapter}.ipynb").read_text())["cells"]
    source = next(("".join(c["source"]) for c in cells
                   if "parameters" in c.get("metadata", {}).get("tags", [])), None)
    if source is None:
        raise ValueError(f"chapter={chapter!r} has no cell tagged 'parameters'")
    names: dict[str, object] = {}
    # the cell is plain assignments of literals (list(range(n)) at most): run it with no
    # builtins but those two
    exec(compile(ast.parse(source), f"{chapter}.ipynb", "exec"),
         {"__builtins__": {"list": list, "range": range}}, names)
    return names


def init_evidence(p: Mapping[str, object]) -> dict[str, pd.DataFrame]:
    """The random-init chapter's studies at its parameters ``p``: the base model per task,
    the initialisation study, the depth-and-width grid with its closed-form prediction, and
    the controls (the same cached calls as the chapter's)."""
    seeds, n = list(range(p["n_seeds"])), p["inputs_per_task"]
    grid_seeds, grid_n = list(range(p["grid_seeds"])), p["grid_inputs_per_task"]
    grid_configs = an.grid_overrides(p["grid_layers"], p["grid_widths"])
    return dict(
        base=memo(an.task_scores, GPTConfig(), seeds, n),
        init=memo(an.config_scores, an.init_overrides(p["init_means"], p["init_stds"]),
                  seeds, n),
        grid=memo(an.config_scores, grid_configs, grid_seeds, grid_n),
        grid_pred=predicted_config_scores(grid_configs, grid_seeds, grid_n),
        controls=memo(an.config_scores, an.control_overrides(), seeds, n),
    )


def _row(claim: str, paper: str, page: str, anchor: str, table: pd.DataFrame | None, by: str,
         evidence: str, note: str = "") -> dict:
    """A scorecard row from ``claims.claim_table`` rows of one claim (None or empty: the
    claim is untested): each group's readings combined, then the verdict over groups, and the
    weakest group's interval as the measurement."""
    link = f'<a href="{page}.html#{anchor}">{page.replace("_", " ")}</a>'
    if table is None or table.empty:
        return dict(claim=claim, paper=paper, measured=note or "not measured",
                    verdict="untested", evidence=evidence, section=link, groups=None)
    per_group = table.groupby(by, sort=False).verdict.apply(claims.combine)
    order = {"fails": 0, "cannot tell": 1, "holds": 2}
    margin = (table["lo"] - table["bound"]).where(table["above"], table["bound"] - table["hi"])
    worst = table.assign(rank=table.verdict.map(order), margin=margin).sort_values(
        ["rank", "margin"]).iloc[0]
    counts = per_group.value_counts()
    tally = ", ".join(f"{v} on {counts[v]}" for v in claims.VERDICTS if v in counts)
    side = ">" if worst["above"] else "<"
    where = str(worst[by])  # a probe's group names its layer already
    if "layer" not in where:
        where += f", layer {int(worst['weakest_layer'])}"
    measured = (f"{tally} of {len(per_group)}; nearest to failing: {where}, "
                f"{worst['mean']:.3f} [{worst['lo']:.3f}, "
                f"{worst['hi']:.3f}] (the claim: {side} {worst['bound']:g})")
    evidence += (f"; {int(table['n'].min())} seeds, one-sided t bounds: holds at level "
                 f"{1 - worst['holds_level']:g} per test, fails Bonferroni over "
                 f"{int(worst['m'])} tests")
    groups = table.rename(columns={by: "group"})[list(GROUP_COLUMNS)]
    return dict(claim=claim, paper=paper, measured=measured + note,
                verdict=claims.overall(per_group), evidence=evidence, section=link,
                groups=groups)


def _specs(prefix: str) -> list[tuple[str, str, str, str]]:
    return [spec for spec in PAPER_ROWS if spec[0].startswith(prefix)]


def init_rows(ev: Mapping[str, pd.DataFrame], p: Mapping[str, object]) -> list[dict]:
    """The rows of results 1 to 3 (random initialisation) from ``init_evidence``."""
    table = claims.claim_table(claims.init_claims(ev["base"], ev["init"], ev["grid"]),
                               by="group")
    live = (f"live: random base model (6 layers x 384), {p['inputs_per_task']} inputs per "
            "task per seed")
    grid = (f"live: {len(p['grid_layers']) * len(p['grid_widths'])} depth-width "
            f"configurations, {p['grid_inputs_per_task']} inputs per task per seed")
    sigma = (f"live: means {p['init_means']} x sigmas {p['init_stds']}, token-embedding "
             "reading")
    where = {"1": live, "2: the pattern holds at initialisation, every": live,
             "2: the pattern holds at initialisation, 6": grid, "3": sigma}
    rows = []
    for claim, paper, page, anchor in PAPER_ROWS:
        ours = next((v for k, v in where.items() if claim.startswith(k)), None)
        if ours is not None:
            rows.append(_row(claim, paper, page, anchor, table[table.claim == claim],
                             "group", ours))
    return rows


def trained_rows(profile: str, tasks: Sequence[str]) -> tuple[list[dict], dict, list[str]]:
    """The rows of results 2 (after training) and 4 from the committed study of ``profile``:
    judged on the tasks learned with margin, "untested" where there is none. Also returns
    the study's files and the judged tasks (for the probe rows)."""
    prof = PROFILES[profile]
    docs, missing = study.load_study(profile, tasks)
    evidence = f"committed study, {profile} profile, whole test split ({prof.n_test:,})"
    specs = [s for s in PAPER_ROWS if s[0].startswith(("2: the pattern holds after", "4"))]
    if not docs:
        return [_row(*s, None, "task", evidence, "no committed study") for s in specs], {}, []
    acc = study.study_accuracy(study.study_table(docs), prof.n_test)
    learned, judged = study.learned_and_judged(acc)
    left = [t for t in tasks if t not in judged]
    note = (f"; not judged: {', '.join(left)} (not in the study or not learned with "
            "margin)") if left else ""
    verdicts = None
    if judged:
        _, verdicts = study.trained_verdicts(docs, acc)
    rows = [_row(*spec, None if verdicts is None else verdicts[verdicts.claim == spec[0]],
                 "task", evidence, note if judged else "no task learned with margin" + note)
            for spec in specs]
    return rows, docs, judged


def probe_rows(pp: Mapping[str, object], docs: Mapping, judged: Sequence[str]) -> list[dict]:
    """The rows of result 5: the random-init comparison at the probes chapter's parameters
    ``pp`` (live) and the committed study's trained models of the ``judged`` tasks."""
    seeds = list(pp["model_seeds"])
    table = random_studies(seeds, pp["T"], pp["w"], pp["n_fit_tokens"], RidgeConfig())
    comp = claims.probe_claims(paired_differences(table[~table.shuffled], "seed"),
                               model="seed")
    mlp = mlp_studies(seeds, pp["T"], pp["w"], pp["mlp_fit_tokens"])
    mlp_comp = claims.probe_claims(paired_differences(mlp, "seed"), model="seed")
    (c1, p1, g1, a1), (cm, pm, gm, am), (c2, p2, g2, a2) = _specs("5")
    live = (f"live: {len(seeds)} random models, window {pp['w']}, length {pp['T']}, "
            "paired per model")
    rows = [_probe_row(c1, p1, g1, a1, comp.reset_index().assign(group="random init"),
                       f"{live}, ridge probe on {pp['n_fit_tokens']:,} fitting tokens"),
            _probe_row(cm, pm, gm, am, mlp_comp.reset_index().assign(group="random init"),
                       f"{live}, MLP probe on {pp['mlp_fit_tokens']:,} fitting tokens")]
    if not judged:
        return rows + [_row(c2, p2, g2, a2, None, "group", "committed study",
                            "no trained task learned with margin")]
    trained = trained_comparison(docs, judged).reset_index().rename(columns={"task": "group"})
    return rows + [_probe_row(c2, p2, g2, a2, trained,
                              "committed study's models, the model as the unit")]


def _probe_row(claim: str, paper: str, page: str, anchor: str, comp: pd.DataFrame,
               evidence: str) -> dict:
    """A probe claim's row: one test per (group, layer) on the NRMSE difference (cosine minus
    variance; the claim says below 0), its verdict the layer's (both metrics)."""
    verdict = comp.verdict.map({"cosine": "holds", "variance": "fails"}).fillna("cannot tell")
    table = pd.DataFrame(dict(
        claim=claim, reading="NRMSE cosine minus variance", group=comp["group"] + ", layer "
        + comp["layer"].astype(str), weakest_layer=comp["layer"], mean=comp["d_nrmse"],
        lo=comp["d_nrmse lo"], hi=comp["d_nrmse hi"], bound=0.0, above=False, n=comp["n"],
        m=comp["m"], holds_level=comp["holds_level"], fails_level=comp["fails_level"],
        verdict=verdict))
    return _row(claim, paper, page, anchor, table, "group", evidence)


def beyond_rows(ev: Mapping[str, pd.DataFrame], p: Mapping[str, object]) -> list[dict]:
    """Rows past the paper: the averaging theory's prediction of every grid configuration's
    side of 0.8, and the bidirectional control's chance level."""
    level = p["level"]
    pred = prediction_table(ev["grid"], ev["grid_pred"], level)
    sides = claims.prediction_sides(pred["predicted"], pred["measured"])
    agree = int((sides == "holds").sum())
    theory = dict(
        groups=None, claim="beyond: the averaging theory", paper="(not in the paper) The closed form "
        "predicts, before any measurement, on which side of 0.8 each configuration's layer-1 "
        "score falls.", measured=f"same side in {agree} of {len(pred)} configurations",
        verdict=claims.overall(sides), evidence=f"live: {len(pred)} configurations x "
        f"{p['grid_seeds']} seeds, prediction from the initialisation alone",
        section='<a href="random_init.html#depth-and-width-predicted-then-measured">'
                "random init</a>")
    controls = ev["controls"]
    bid = claims.claim_table(claims.chance_control(controls[~controls.causal]), by="group")
    control = _row("beyond: bidirectional control", "(not in the paper) Without the causal "
                   "mask the pattern cannot form: every layer within 0.1 of 0.5.",
                   "random_init", "controls-the-paper-does-not-show", bid, "group",
                   "live: bidirectional base model")
    return [theory, control]


LONG_PAPER = (  # the long-sequence readings (claims.LONG_CLAIMS), as the scorecard states them
    "(not in the paper) At initialisation, the layer-1 score stays in the paper's range "
    "(0.8 or more) along the committed study's longest sequences.",
    "(not in the paper) Every layer stays above chance (0.6) along them.",
    "(not in the paper) The criticism (Dawes et al.): along them, nearby positions cannot be "
    "told apart in the global-attention models (\"holds\" is the criticism holding).",
    "(not in the paper) The contrast the criticism expects: a sliding-window model still "
    "tells nearby positions apart along them.",
)


def long_rows() -> list[dict]:
    """Rows past the paper from the committed long-sequence study (``nopelib.long_context``):
    the readings of ``claims.long_claims`` and the theory's resolution prediction; untested
    rows without the study."""
    doc = results.load_all("long").get("long_context.json")
    anchor = "the-verdict-on-the-criticism"
    if doc is None:
        return [_row(c, p, "long_sequences", anchor, None, "group", "no committed study",
                     "run python -m nopelib.long_context")
                for (c, _), p in zip(claims.LONG_CLAIMS, LONG_PAPER)]
    frames = long_context.run_frames(doc["runs"])
    T = doc["provenance"]["T"]
    table = claims.claim_table(claims.long_claims(frames["scores"], frames["order"]),
                               by="group")
    evidence = f"committed: random 6-layer models at {T:,} tokens"
    rows = [_row(c, p, "long_sequences", anchor, table[table.claim == c], "group", evidence)
            for (c, _), p in zip(claims.LONG_CLAIMS, LONG_PAPER)]
    agree = claims.resolution_agreement(long_context.resolution(frames["order"]))
    informative = agree[agree != "uninformative"]
    n = int((informative == "agrees").sum())
    rows.append(dict(
        groups=None, claim="beyond: the theory's resolution d*(i)",
        paper="(not in the paper) The averaging theory predicts, before the model runs, how far "
        "back row i tells a position from its neighbour (d*(i), layer 1).",
        measured=f"inside the measured interval in {n} of the {len(informative)} informative "
                 f"octaves and models ({len(agree) - len(informative)} of {len(agree)} say "
                 "nothing either way: predicted unresolved, interval open at the top)",
        verdict=claims.overall(informative.map({"agrees": "holds", "disagrees": "fails"})),
        evidence=f"{evidence}; pointwise t intervals over seeds",
        section='<a href="long_sequences.html#resolution-predicted-beside-measured">'
                "long sequences</a>"))
    return rows


def scorecard(profile: str = "study") -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every row, results 1 to 6 of the paper then what goes beyond it (``COLUMNS``), and the
    tests behind them, one row per claim and group (``GROUP_COLUMNS``)."""
    p, pp = chapter_defaults("random_init"), chapter_defaults("probes")
    tasks = chapter_defaults("trained")["tasks"]
    ev = init_evidence(p)
    rows = init_rows(ev, p)
    trained, docs, judged = trained_rows(profile, tasks)
    rows += trained + probe_rows(pp, docs, judged)
    c6, p6, g6, a6 = _specs("6")[0]
    rows.append(_row(c6, p6, g6, a6, None, "group", "no trained model on long sequences",
                     "untested on trained models; at initialisation see the long-sequence "
                     "rows below"))
    rows += beyond_rows(ev, p) + long_rows()
    order = [spec[0] for spec in PAPER_ROWS]
    rows.sort(key=lambda r: order.index(r["claim"]) if r["claim"] in order else len(order))
    groups = pd.concat([r["groups"] for r in rows if r["groups"] is not None],
                       ignore_index=True)
    return pd.DataFrame(rows, columns=list(COLUMNS)), groups


def to_html(card: pd.DataFrame) -> str:
    """The scorecard as an HTML table: every cell escaped but the section's link."""
    head = "".join(f"<th>{escape(c)}</th>" for c in COLUMNS)
    body = "".join(
        f'<tr class="verdict-{row.verdict.replace(" ", "-")}">'
        + "".join(f"<td>{getattr(row, c) if c == 'section' else escape(getattr(row, c))}</td>"
                  for c in COLUMNS) + "</tr>"
        for row in card.itertuples())
    return f'<table class="scorecard"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
