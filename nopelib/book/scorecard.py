"""The replication at a glance: one row per reading of each claim, then what goes beyond.

The replication at a glance: one row per reading of each claim of the paper, then what goes
beyond it.

A claim of the paper is judged in one or more readings (``nopelib.rules.claims``: e.g. "later layers
weaken it" as "the last layer ends below layer 1" and as "the last layer ends below its own
initialisation"). Readings are alternatives, never ANDed: each reading is a row with its own
verdict, under the claim's statement, which its readings share. Within a row the reading's
groups (tasks, configurations) are combined as ``claims.overall`` does: "replicates",
"partly", "fails", "cannot tell", or "untested" where nothing tests it yet.

Every row names its model (``model_label``: layers x width and the initial standard deviation
of the token embedding) and says whether it lies inside the paper's grid (``in_paper_grid``:
6-24 layers x 192-768 wide, the base model 6 x 384 at sigma 0.02). The random-initialisation
rows use the paper's base model (the grid row its grid, the sigma rows the initialisation
study's configurations); the trained rows come from the committed study of each training
profile asked for, the paper's model first (``TRAINED_PROFILES``): a profile with no committed
study gives "untested" rows that say it is not yet trained.

Every verdict comes from the rules of ``nopelib.rules.claims`` (the ones the chapters use), applied
to the chapters' own studies at the chapters' default parameters: ``chapter_defaults`` reads
them from each chapter's parameters cell, and the studies come from the same calls through the
run and results caches (``nopelib.store.memo``), so within one build the scorecard judges the very
numbers the chapters show. ``to_html`` draws the rows as a list of verdicts: a coloured badge,
the claim and its reading, the model; the measurement, the evidence and the section folded
beneath.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from html import escape
from pathlib import Path

import pandas as pd

from nopelib.core import corpus
from nopelib.core.model import GPTConfig
from nopelib.core.params import Choice
from nopelib.core.probe import RidgeConfig
from nopelib.rules import beyond_claims, claims, init_claims
from nopelib.store.memo import memo
from nopelib.studies import analysis as an, long_context, results, study, text_study
from nopelib.studies.probe_study import (mlp_studies, paired_differences, random_studies,
                                         trained_comparison)
from nopelib.studies.theory_studies import predicted_config_scores, prediction_table
from nopelib.training import text_lm
from nopelib.training.profiles import PROFILES

BOOK = Path(__file__).resolve().parents[2] / "book"
# the chapter's parameters: the trained study of the paper's model (shown first) and the
# committed study shown beside it
CHAPTER_PARAMS = {"headline_profile": Choice(PROFILES), "profile": Choice(PROFILES)}
# the trained studies the scorecard shows by default, in order: the paper's model first
TRAINED_PROFILES = ("paper_study", "study")
# the scorecard's words: claims.overall's over a reading's groups, and "untested"
VERDICTS = ("replicates", "partly", "fails", "cannot tell", "untested")
# one row per reading: ``ref`` is the claim's number with a letter per reading where several
# readings share the number (the margins figure labels its groups with it)
COLUMNS = ("ref", "claim", "reading", "model", "grid", "paper", "measured", "verdict",
           "evidence", "section")
# one row per reading and group (task, configuration, layer) behind a scorecard row; its
# ``claim`` is the row's ref and the claim's words ("2c: the pattern holds after training")
GROUP_COLUMNS = ("claim", "group", "reading", "weakest_layer", "mean", "lo", "hi", "bound",
                 "above", "verdict")

PAPER_LAYERS = (6, 24)  # the paper's grid (PAPER.md): 6 to 24 layers ...
PAPER_WIDTHS = (192, 768)  # ... x 192 to 768 wide, NoPE and causal
INSIDE, OUTSIDE, PARTLY = ("inside the paper's grid", "outside the paper's grid",
                           "partly inside the paper's grid")

# (claim label in nopelib.rules.claims, the paper's statement, chapter page and section anchor)
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
SPECS = {spec[0]: spec for spec in PAPER_ROWS}
# the probe claim's reading (init_claims.probe_claims: both metrics at every layer from 1)
PROBE_READING = "cosine features: lower NRMSE and higher R, every layer from 1"
NOT_TRAINED = "not yet trained"


# ---------------------------------------------------------------------------------------------
# the model of a row


def in_paper_grid(config: GPTConfig) -> bool:
    """Whether ``config`` is a model of the paper's grid: a causal decoder with no position
    encoding, 6 to 24 layers and 192 to 768 wide (PAPER.md). The initialisation is not part of
    the grid (the paper varies it on the base model); ``model_label`` names it."""
    return (PAPER_LAYERS[0] <= config.n_layer <= PAPER_LAYERS[1]
            and PAPER_WIDTHS[0] <= config.n_embd <= PAPER_WIDTHS[1]
            and config.pos_encoding == "none" and config.causal)


def grid_status(inside: Sequence[bool]) -> str:
    """A row's words for whether its models (``in_paper_grid`` of each) lie in the paper's
    grid: INSIDE when all do, OUTSIDE when none does, else PARTLY."""
    inside = [bool(x) for x in inside]
    if not inside:
        raise ValueError("grid_status: no model")
    return INSIDE if all(inside) else OUTSIDE if not any(inside) else PARTLY


def _span(values: Sequence[float]) -> str:
    vals = sorted(set(values))
    return f"{vals[0]:g}" if len(vals) == 1 else f"{vals[0]:g}–{vals[-1]:g}"


def model_label(configs: GPTConfig | Sequence[GPTConfig]) -> str:
    """A model's words: layers x width and the initial standard deviation of the token
    embedding, e.g. "6 layers × 384 wide, token-embedding σ 0.02" (``init_target``
    "embedding": only the token embedding is drawn at ``init_std``; "all": "σ 0.2 on every
    weight"), with the mean where it is not 0, a position encoding and a bidirectional mask
    where there is one. Several configurations give each field's range ("6–24 layers ×
    192–768 wide")."""
    configs = [configs] if isinstance(configs, GPTConfig) else list(configs)
    if not configs:
        raise ValueError("model_label: no configuration")
    targets = {c.init_target for c in configs}
    if len(targets) > 1:
        raise ValueError(f"model_label: the configurations mix init targets {sorted(targets)}")
    means, stds = [c.init_mean for c in configs], [c.init_std for c in configs]
    init = f"σ {_span(stds)}" if not any(means) else f"mean {_span(means)}, σ {_span(stds)}"
    init = f"token-embedding {init}" if targets == {"embedding"} else f"{init} on every weight"
    label = (f"{_span([c.n_layer for c in configs])} layers × "
             f"{_span([c.n_embd for c in configs])} wide, {init}")
    encodings = sorted({c.pos_encoding for c in configs} - {"none"})
    if encodings:
        label += f", {' or '.join(encodings)} position encoding"
    if not any(c.causal for c in configs):
        label += ", bidirectional"
    elif not all(c.causal for c in configs):
        label += ", causal or bidirectional"
    return label


def _model(configs: GPTConfig | Sequence[GPTConfig], note: str = "") -> tuple[str, str]:
    """A row's (model label, grid words) for ``configs``, ``note`` appended to the label."""
    configs = [configs] if isinstance(configs, GPTConfig) else list(configs)
    return model_label(configs) + note, grid_status([in_paper_grid(c) for c in configs])


# ---------------------------------------------------------------------------------------------
# the rows


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


def _link(page: str, anchor: str) -> str:
    return f'<a href="{page}.html#{anchor}">{page.replace("_", " ")}</a>'


def _row(spec: tuple[str, str, str, str], reading: str, model: tuple[str, str],
         table: pd.DataFrame | None, by: str, evidence: str, note: str = "") -> dict:
    """The scorecard row of one reading of a claim (``spec``: a PAPER_ROWS entry) on one
    ``model`` (``_model``'s label and grid words) from the reading's ``claims.claim_table``
    rows (None or empty: untested, ``note`` as the measurement): its groups (``by``) combined
    by ``claims.overall``, the weakest group's interval as the measurement."""
    claim, paper, page, anchor = spec
    row = dict(claim=claim, reading=reading, model=model[0], grid=model[1], paper=paper,
               section=_link(page, anchor))
    if table is None or table.empty:
        return dict(row, measured=note or "not measured", verdict="untested",
                    evidence=evidence, groups=None)
    if set(table["reading"]) != {reading}:
        raise ValueError(f"{claim}: a row is one reading ({reading!r}), not "
                         f"{sorted(set(table['reading']))}")
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
    return dict(row, measured=measured + note, verdict=claims.overall(per_group),
                evidence=evidence, groups=groups)


def init_rows(ev: Mapping[str, pd.DataFrame], p: Mapping[str, object]) -> list[dict]:
    """The rows of results 1 to 3 (random initialisation) from ``init_evidence``, one per
    reading of ``init_claims.INIT_CLAIMS``: the base model, the grid's configurations, the
    initialisation study's (token-embedding reading) for the sigma rows."""
    table = claims.claim_table(init_claims.init_claims(ev["base"], ev["init"], ev["grid"]),
                               by="group")
    base = GPTConfig()
    grid = [replace(base, **o) for o in an.grid_overrides(p["grid_layers"], p["grid_widths"])]

    def sigmas(keep) -> list[GPTConfig]:  # the initialisation study's configurations judged
        return [replace(base, init_mean=float(m), init_std=float(s))
                for m in p["init_means"] for s in p["init_stds"] if keep(s)]

    live = f"live: random models, {p['inputs_per_task']} inputs per task per seed"
    grid_live = (f"live: {len(grid)} depth-width configurations, "
                 f"{p['grid_inputs_per_task']} inputs per task per seed")
    sigma_live = f"{live}; the token-embedding reading of the initialisation study"
    study_note = ", the initialisation study"
    keeps, removes, means = (c for c, _ in init_claims.INIT_CLAIMS[4:7])
    models = {  # claim -> (model, evidence)
        init_claims.INIT_CLAIMS[3][0]: (_model(grid, ", the grid"), grid_live),
        keeps: (_model(sigmas(lambda s: s <= 0.02), study_note), sigma_live),
        removes: (_model(sigmas(lambda s: s >= 0.2), study_note), sigma_live),
        means: (_model(sigmas(lambda s: s <= 0.02), study_note), sigma_live),
    }
    rows = []
    for claim, reading in init_claims.INIT_CLAIMS:
        model, evidence = models.get(claim, (_model(base), live))
        mine = table[(table.claim == claim) & (table.reading == reading)]
        rows.append(_row(SPECS[claim], reading, model, mine, "group", evidence))
    return rows


def _tag_groups(row: dict, profile: str) -> dict:
    """``row`` with its groups named after the trained ``profile`` too (two profiles judge
    the same reading on the same tasks)."""
    if row["groups"] is not None:
        row["groups"] = row["groups"].assign(group=row["groups"]["group"] + f" ({profile})")
    return row


def trained_rows(profile: str, tasks: Sequence[str]) -> tuple[list[dict], dict]:
    """The rows of results 2 (after training) and 4 from the committed study of ``profile``,
    one per reading of ``claims.TRAINED_CLAIMS``: judged on the tasks learned with margin,
    "untested" where there is none or no study ("not yet trained"). Also returns what the
    probe rows need: the profile, its model, the study's files, the judged tasks and the
    note an untested row gives."""
    prof = PROFILES[profile]
    model = _model(prof.model, f", trained ({profile} profile)")
    docs, _ = study.load_study(profile, tasks)
    evidence = f"committed study, {profile} profile, whole test split ({prof.n_test:,})"
    info = dict(profile=profile, model=model, docs=docs, judged=[], note="")
    if not docs:
        stale = study.stale_tasks(profile, tasks)
        note = NOT_TRAINED if not stale else (
            f"committed study of {', '.join(stale)} stale (trained under an earlier profile)")
        info["note"] = note
        return [_row(SPECS[c], r, model, None, "task", f"no committed study of the "
                     f"{profile} profile", note) for c, r in claims.TRAINED_CLAIMS], info
    # a study in flight holds fewer seeds than its profile: a task is judged at all of them
    acc = study.study_accuracy(study.study_table(docs), prof.n_test,
                               n_seeds=len(prof.seeds))
    _, judged = study.learned_and_judged(acc)
    left = [t for t in tasks if t not in judged]
    note = (f"; not judged: {', '.join(left)} (not in the study, not every seed in yet, or "
            "not learned with margin)") if left else ""
    verdicts = study.trained_verdicts(docs, acc)[1] if judged else None
    info.update(judged=judged, note="no trained task learned with margin")
    rows = []
    for claim, reading in claims.TRAINED_CLAIMS:
        mine = None if verdicts is None else verdicts[(verdicts.claim == claim)
                                                      & (verdicts.reading == reading)]
        rows.append(_tag_groups(_row(SPECS[claim], reading, model, mine, "task", evidence,
                                     note if judged else info["note"] + note), profile))
    return rows, info


def probe_rows(pp: Mapping[str, object], trained: Sequence[Mapping]) -> list[dict]:
    """The rows of result 5: the random-init comparison at the probes chapter's parameters
    ``pp`` (live, the base model), and per trained study (``trained_rows``'s second value)
    its models of the judged tasks."""
    seeds = list(pp["model_seeds"])
    table = random_studies(seeds, pp["T"], pp["w"], pp["n_fit_tokens"], RidgeConfig())
    comp = init_claims.probe_claims(paired_differences(table[~table.shuffled], "seed"),
                               model="seed")
    mlp = mlp_studies(seeds, pp["T"], pp["w"], pp["mlp_fit_tokens"])
    mlp_comp = init_claims.probe_claims(paired_differences(mlp, "seed"), model="seed")
    ridge_spec, mlp_spec, trained_spec = (s for s in PAPER_ROWS if s[0].startswith("5"))
    live = (f"live: {len(seeds)} random models, window {pp['w']}, length {pp['T']}, "
            "paired per model")
    base = _model(GPTConfig())
    rows = [_probe_row(ridge_spec, base, comp.reset_index().assign(group="random init"),
                       f"{live}, ridge probe on {pp['n_fit_tokens']:,} fitting tokens"),
            _probe_row(mlp_spec, base, mlp_comp.reset_index().assign(group="random init"),
                       f"{live}, MLP probe on {pp['mlp_fit_tokens']:,} fitting tokens")]
    for info in trained:
        if not info["judged"]:
            rows.append(_row(trained_spec, PROBE_READING, info["model"], None, "group",
                             f"committed study, {info['profile']} profile", info["note"]))
            continue
        # the probes chapter's trained verdict: each layer minus the same model's layer 0
        comp = trained_comparison(info["docs"], info["judged"], subtract_format=True
                                  ).reset_index().rename(columns={"task": "group"})
        rows.append(_tag_groups(_probe_row(
            trained_spec, info["model"], comp, f"committed study's models, {info['profile']} "
            "profile, the model as the unit, format-subtracted (each layer minus the same "
            "model's layer 0)"), info["profile"]))
    return rows


def _probe_row(spec: tuple[str, str, str, str], model: tuple[str, str], comp: pd.DataFrame,
               evidence: str) -> dict:
    """A probe comparison's row: one test per (group, layer) on the NRMSE difference (cosine
    minus variance; the claim says below 0), its verdict the layer's (both metrics)."""
    verdict = comp.verdict.map({"cosine": "holds", "variance": "fails"}).fillna("cannot tell")
    table = pd.DataFrame(dict(
        claim=spec[0], reading=PROBE_READING, group=comp["group"] + ", layer "
        + comp["layer"].astype(str), weakest_layer=comp["layer"], mean=comp["d_nrmse"],
        lo=comp["d_nrmse lo"], hi=comp["d_nrmse hi"], bound=0.0, above=False, n=comp["n"],
        m=comp["m"], holds_level=comp["holds_level"], fails_level=comp["fails_level"],
        verdict=verdict))
    return _row(spec, PROBE_READING, model, table, "group", evidence)


def beyond_rows(ev: Mapping[str, pd.DataFrame], p: Mapping[str, object]) -> list[dict]:
    """Rows past the paper: the averaging theory's prediction of every grid configuration's
    side of 0.8, and the bidirectional control's chance level."""
    level = p["level"]
    pred = prediction_table(ev["grid"], ev["grid_pred"], level)
    sides = init_claims.prediction_sides(pred["predicted"], pred["measured"])
    agree = int((sides == "holds").sum())
    grid = [replace(GPTConfig(), **o) for o in an.grid_overrides(p["grid_layers"],
                                                                  p["grid_widths"])]
    label, inside = _model(grid, ", the grid")
    theory = dict(
        groups=None, claim="beyond: the averaging theory",
        reading="each configuration's layer-1 score on the predicted side of 0.8",
        model=label, grid=inside, paper="(not in the paper) The closed form predicts, before "
        "any measurement, on which side of 0.8 each configuration's layer-1 score falls.",
        measured=f"same side in {agree} of {len(pred)} configurations",
        verdict=claims.overall(sides), evidence=f"live: {len(pred)} configurations x "
        f"{p['grid_seeds']} seeds, prediction from the initialisation alone",
        section=_link("random_init", "depth-and-width-predicted-then-measured"))
    controls = ev["controls"]
    bid = claims.claim_table(init_claims.chance_control(controls[~controls.causal]), by="group")
    spec = ("beyond: bidirectional control", "(not in the paper) Without the causal mask the "
            "pattern cannot form: every layer within 0.1 of 0.5.", "random_init",
            "controls-the-paper-does-not-show")
    control = _row(spec, f"every layer within {init_claims.NEAR_CHANCE:g} of 0.5",
                   _model(replace(GPTConfig(), causal=False)), bid, "group",
                   "live: bidirectional base model")
    return [theory, control]


LONG_PAPER = (  # the long-sequence readings (beyond_claims.LONG_CLAIMS), as the scorecard states them
    "(not in the paper) At initialisation, the layer-1 score stays in the paper's range "
    "(0.8 or more) along the committed study's longest sequences.",
    "(not in the paper) Every layer stays above chance (0.6) along them.",
    "(not in the paper) The criticism (Dawes et al.): along them, nearby positions cannot be "
    "told apart in the global-attention models (\"holds\" is the criticism holding).",
    "(not in the paper) The contrast the criticism expects: a sliding-window model still "
    "tells nearby positions apart along them.",
)


def _long_models(runs: Sequence[Mapping], base: GPTConfig) -> dict[str, tuple[str, str]]:
    """The long-sequence study's models as rows name them: "global" (global attention at
    every width), "window" (the sliding-window models) and "all"."""
    widths = sorted({r["n_embd"] for r in runs if not r["window"]})
    windows = sorted({(r["n_embd"], r["window"]) for r in runs if r["window"]})
    glob = [replace(base, n_embd=w) for w in widths]
    win = [replace(base, n_embd=w) for w, _ in windows]
    said = ", ".join(f"{w} wide" for w, _ in windows)
    span = _span([W for _, W in windows]) if windows else ""
    models = {}
    if glob:
        models["global"] = _model(glob, ", global attention")
    if win:  # the paper's models attend to every earlier position: a window is outside
        models["window"] = (model_label(win) + f", sliding window {span}", OUTSIDE)
        models["all"] = (model_label(glob + win) + f", global attention and a sliding window "
                         f"{span} ({said})" if glob else models["window"][0],
                         grid_status([in_paper_grid(c) for c in glob] + [False] * len(win)))
    else:
        models["all"] = models["global"]
    return models


def long_rows() -> list[dict]:
    """Rows past the paper from the committed long-sequence study
    (``nopelib.studies.long_context``): one per reading of ``beyond_claims.long_claims`` and the theory's
    resolution prediction; untested rows without the study."""
    doc = results.load_all("long").get("long_context.json")
    anchor = "the-verdict-on-the-criticism"
    specs = [(c, r, (c, p, "long_sequences", anchor))
             for (c, r), p in zip(beyond_claims.LONG_CLAIMS, LONG_PAPER)]
    if doc is None:
        base = _model(GPTConfig())
        return [_row(spec, r, base, None, "group", "no committed study",
                     "run python -m nopelib.studies.long_context") for _, r, spec in specs]
    frames = long_context.run_frames(doc["runs"])
    T = doc["provenance"]["T"]
    models = _long_models(doc["runs"], GPTConfig(**doc["provenance"]["base"]))
    # the readings' models: every model, every model, global attention, the windows
    which = ("all", "all", "global", "window")
    table = claims.claim_table(beyond_claims.long_claims(frames["scores"], frames["order"]),
                               by="group")
    evidence = f"committed: random models at {T:,} tokens"
    rows = [_row(spec, r, models.get(w, models["all"]),
                 table[(table.claim == c) & (table.reading == r)], "group", evidence)
            for (c, r, spec), w in zip(specs, which)]
    agree = beyond_claims.resolution_agreement(long_context.resolution(frames["order"]))
    informative = agree[agree != "uninformative"]
    n = int((informative == "agrees").sum())
    label, inside = models["all"]
    rows.append(dict(
        groups=None, claim="beyond: the theory's resolution d*(i)",
        reading="d*(i) inside the measured interval, every informative octave and model",
        model=label, grid=inside,
        paper="(not in the paper) The averaging theory predicts, before the model runs, how far "
        "back row i tells a position from its neighbour (d*(i), layer 1).",
        measured=f"inside the measured interval in {n} of the {len(informative)} informative "
                 f"octaves and models ({len(agree) - len(informative)} of {len(agree)} say "
                 "nothing either way: predicted unresolved, interval open at the top)",
        verdict=claims.overall(informative.map({"agrees": "holds", "disagrees": "fails"})),
        evidence=f"{evidence}; pointwise t intervals over seeds",
        section=_link("long_sequences", "resolution-predicted-beside-measured")))
    return rows


TEXT_PAPER = (  # the text readings (beyond_claims.TEXT_CLAIMS), as the scorecard states them
    "(not in the paper) The pattern shows on real text before training, in the text study's "
    "NoPE models.",
    "(not in the paper) A NoPE language model trained on real text shows it in layer 1.",
    "(not in the paper) ... in the paper's layer-1 range (0.8 or more).",
    "(not in the paper) ... in every layer.",
    "(not in the paper) ... past the length it was trained on.",
    "(not in the paper) Claim 4 on text: its last layer ends below layer 1.",
    "(not in the paper) NoPE pays for position on text: higher test bits per character than "
    "a learned position table.",
)


def text_rows() -> list[dict]:
    """Rows past the paper on real text (``beyond_claims.TEXT_CLAIMS``): the initialisation reading
    judged on the text chapter's live study at its default parameters (the same cached call
    as the chapter's), the trained readings untested until the text study is committed."""
    p = chapter_defaults("text")
    prof = text_lm.get_text_profile(p["profile"])
    model = _model(prof.config("none", len(corpus.load().vocab)))
    specs = [(c, r, (c, paper, "text", anchor)) for (c, r), paper, anchor in zip(
        beyond_claims.TEXT_CLAIMS, TEXT_PAPER,
        ["the-first-reading-of-the-rule"] + ["the-trained-study-and-the-rule-that-will-judge-it"]
        * (len(beyond_claims.TEXT_CLAIMS) - 1))]
    scores = memo(text_study.init_scores, p["profile"], p["seeds"], p["lengths"])
    table = claims.claim_table(beyond_claims.text_init_claims(scores), by="group")
    claim, reading, spec = specs[0]
    rows = [_row(spec, reading, model, table, "group",
                 "live: the text study's NoPE models at initialisation, held-out windows of "
                 "the test books")]
    return rows + [_row(spec, r, model, None, "group", "no committed text study",
                        "run python -m nopelib.studies.text_study") for _, r, spec in specs[1:]]


def _refs(rows: Sequence[Mapping]) -> dict[tuple[str, str], str]:
    """Each (claim, reading)'s reference: the claim's number ("4", or "beyond"), with a
    letter in order of appearance where several readings share the number ("4a", "4b";
    "beyond a")."""
    pairs = list(dict.fromkeys((r["claim"], r["reading"]) for r in rows))
    prefix = {pair: pair[0].split(":")[0] for pair in pairs}
    refs = {}
    for number in dict.fromkeys(prefix.values()):
        mine = [pair for pair in pairs if prefix[pair] == number]
        sep = "" if number.isdigit() else " "
        for i, pair in enumerate(mine):
            refs[pair] = number if len(mine) == 1 else f"{number}{sep}{chr(ord('a') + i)}"
    return refs


def _profiles(profiles: str | Sequence[str]) -> list[str]:
    profiles = [profiles] if isinstance(profiles, str) else list(dict.fromkeys(profiles))
    unknown = [p for p in profiles if p not in PROFILES]
    if not profiles or unknown:
        raise ValueError(f"profiles={profiles!r}: give one or more of {sorted(PROFILES)}")
    return profiles


def scorecard(profiles: str | Sequence[str] = TRAINED_PROFILES
              ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every row, one per reading: results 1 to 6 of the paper then what goes beyond it
    (``COLUMNS``), with the trained rows of each of ``profiles`` (in that order: the paper's
    model first), and the tests behind them, one row per reading and group
    (``GROUP_COLUMNS``)."""
    profiles = _profiles(profiles)
    p, pp = chapter_defaults("random_init"), chapter_defaults("probes")
    tasks = chapter_defaults("trained")["tasks"]
    ev = init_evidence(p)
    rows = init_rows(ev, p)
    studies = []
    for profile in profiles:
        trained, info = trained_rows(profile, tasks)
        rows += trained
        studies.append(info)
    rows += probe_rows(pp, studies)
    headline = studies[0]
    rows.append(_row(SPECS["6: beyond ~30 tokens"], "the pattern on trained models at "
                     "lengths past the paper's", headline["model"], None, "group",
                     "no trained model on long sequences", "untested on trained models; at "
                     "initialisation see the long-sequence rows below"))
    rows += beyond_rows(ev, p) + long_rows() + text_rows()
    order = [spec[0] for spec in PAPER_ROWS]
    rows.sort(key=lambda r: order.index(r["claim"]) if r["claim"] in order else len(order))
    refs = _refs(rows)
    for row in rows:
        row["ref"] = refs[(row["claim"], row["reading"])]
    groups = pd.concat([r["groups"].assign(claim=f"{r['ref']}: "
                                           f"{r['claim'].split(':', 1)[-1].strip()}")
                        for r in rows if r["groups"] is not None], ignore_index=True)
    return pd.DataFrame(rows, columns=list(COLUMNS)), groups


def summary(card: pd.DataFrame) -> dict[str, int]:
    """The scorecard's counts: rows for the paper's results by verdict (``n_<verdict>``, spaces
    as underscores), all of them (``n_paper_rows``), its claims, those judged on a model outside
    the paper's grid, and the rows beyond the paper."""
    paper = card[~card.claim.str.startswith("beyond")]
    counts = {f"n_{v.replace(' ', '_')}": int((paper.verdict == v).sum()) for v in VERDICTS}
    return {**counts, "n_paper_rows": len(paper), "n_claims": int(paper.claim.nunique()),
            "n_outside": int((paper.grid == OUTSIDE).sum()),
            "n_beyond_rows": len(card) - len(paper)}


# ---------------------------------------------------------------------------------------------
# the page

# plain CSS, shipped inside to_html's output (no stylesheet to fetch): a verdict's colour is
# the custom property --sc-colour its row's class sets
CSS = """
.scorecard { margin: 0.5em 0 1.5em; }
.scorecard .sc-part { margin: 1.1em 0 0.3em; font-size: 0.85em; font-weight: 600;
  letter-spacing: 0.04em; text-transform: uppercase; opacity: 0.7; }
.scorecard details.sc-row { margin: 0.25em 0; padding: 0.3em 0.6em;
  border-left: 5px solid var(--sc-colour); border-radius: 4px;
  background: rgba(128, 128, 128, 0.07); }
.scorecard details.sc-row > summary { cursor: pointer; line-height: 1.5; }
.scorecard .sc-badge { display: inline-block; min-width: 6.8em; margin-right: 0.4em;
  padding: 0 0.5em; border: 1.5px solid var(--sc-colour); border-radius: 0.8em;
  background: var(--sc-colour); color: #fff; font-size: 0.8em; font-weight: 600;
  text-align: center; }
.scorecard .sc-ref { margin-right: 0.3em; font-weight: 700; }
.scorecard .sc-reading { opacity: 0.85; }
.scorecard .sc-model { display: block; margin-left: 1.1em; font-size: 0.85em; opacity: 0.85; }
.scorecard .sc-grid { margin-left: 0.4em; padding: 0 0.35em; border: 1px solid;
  border-radius: 3px; font-size: 0.95em; }
.scorecard .sc-grid-inside { opacity: 0.75; }
.scorecard .sc-grid-outside { color: #b54708; font-weight: 700; }
.scorecard .sc-grid-partly { color: #b54708; }
.scorecard .sc-body { margin: 0.4em 0 0.2em 1.1em; font-size: 0.9em; }
.scorecard .sc-body dt { font-weight: 600; }
.scorecard .sc-body dd { margin: 0 0 0.35em 0; }
.scorecard .sc-replicates { --sc-colour: #2e7d32; }
.scorecard .sc-partly { --sc-colour: #e09b00; }
.scorecard .sc-partly .sc-badge { color: #1f1f1f; }
.scorecard .sc-fails { --sc-colour: #c1121f; }
.scorecard .sc-cannot-tell { --sc-colour: #6c757d; }
.scorecard .sc-untested { --sc-colour: #9aa0a6; }
.scorecard .sc-untested .sc-badge { background: transparent; color: inherit;
  border-style: dashed; }
"""
GRID_CLASSES = {INSIDE: "sc-grid-inside", OUTSIDE: "sc-grid-outside",
                PARTLY: "sc-grid-partly"}


def verdict_class(verdict: str) -> str:
    """The CSS class of a row with ``verdict`` (one of VERDICTS): "sc-cannot-tell"."""
    if verdict not in VERDICTS:
        raise ValueError(f"verdict={verdict!r} is not one of {VERDICTS}")
    return "sc-" + verdict.replace(" ", "-")


def _html_row(row) -> str:
    """One row: a summary line (badge, ref, claim, reading; the model and its grid words
    beneath), and folded under it the paper's statement, the measurement, the evidence and
    the section's link (the only text not escaped)."""
    claim = row.claim.split(":", 1)[-1].strip()
    body = "".join(f"<dt>{name}</dt><dd>{escape(str(text))}</dd>" for name, text in (
        ("The paper", row.paper), ("Measured", row.measured), ("Evidence", row.evidence)))
    return (f'<details class="sc-row {verdict_class(row.verdict)}"><summary>'
            f'<span class="sc-badge">{escape(row.verdict)}</span>'
            f'<span class="sc-ref">{escape(str(row.ref))}</span> '
            f'<span class="sc-claim">{escape(claim)}</span>'
            f'<span class="sc-reading"> — {escape(row.reading)}</span>'
            f'<span class="sc-model">{escape(row.model)}'
            f'<span class="sc-grid {GRID_CLASSES[row.grid]}">{escape(row.grid)}</span>'
            f'</span></summary><dl class="sc-body">{body}'
            f"<dt>Section</dt><dd>{row.section}</dd></dl></details>")


def to_html(card: pd.DataFrame) -> str:
    """The scorecard as a list of verdicts (a ``<details>`` per row, the page's CSS with
    it): every text escaped but the section's link."""
    missing = [c for c in COLUMNS if c not in card.columns]
    if missing:
        raise ValueError(f"to_html: the card lacks columns {missing}")
    parts, part = [f"<style>{CSS}</style>", '<div class="scorecard">'], None
    for row in card.itertuples(index=False):
        here = "Beyond the paper" if row.claim.startswith("beyond") else "The paper's results"
        if here != part:
            parts.append(f'<p class="sc-part">{escape(here)}</p>')
            part = here
        parts.append(_html_row(row))
    return "".join(parts) + "</div>"
