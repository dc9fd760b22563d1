"""The scorecard's rows of the paper's claims: each row's model, and the evidence it is judged on.

A row is one reading of a claim on one model (named, inside or outside the paper's grid),
judged by ``nopelib.rules`` on the chapters' own studies at their default parameters: the
initialisation's readings (results 1 to 3), the trained models' (claims 2 and 4) and the
probes' (claim 5).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import pandas as pd

from nopelib.book.chapters import section_of
from nopelib.core.model import GPTConfig
from nopelib.core.probe import RidgeConfig
from nopelib.rules import beyond_claims, claims, init_claims
from nopelib.core import analysis as an
from nopelib.results import trained_files as committed, trained_tables
from nopelib.studies.probe_study import (mlp_studies, paired_differences, random_studies,
                                         trained_comparison)
from nopelib.training.profiles import PROFILES


# the trained studies the scorecard shows by default, in order: the paper's model first
TRAINED_PROFILES = ("paper_study", "study")
# the scorecard's words: claims.overall's over a reading's groups, and "untested"
VERDICTS = ("replicates", "partly", "fails", "cannot tell", "untested")
# one row per reading: ``ref`` is the claim's number with a letter per reading where several
# readings share the number (the margins figure labels its groups with it); ``in_flight``
# counts the row's tasks not in yet (still training or stale: "cannot tell" until in)
COLUMNS = ("ref", "claim", "reading", "model", "grid", "paper", "measured", "verdict",
           "evidence", "section", "in_flight")
# one row per reading and group (task, configuration, layer) behind a scorecard row; its
# ``claim`` is the row's ref and the claim's words ("2c: the pattern holds after training")
GROUP_COLUMNS = ("claim", "group", "reading", "weakest_layer", "mean", "lo", "hi", "bound",
                 "above", "verdict")

PAPER_LAYERS = (6, 24)  # the paper's grid (its result 2): 6 to 24 layers ...
PAPER_WIDTHS = (192, 768)  # ... x 192 to 768 wide, NoPE and causal
PAPER_GRID = "{}–{} layers × {}–{} wide".format(*PAPER_LAYERS, *PAPER_WIDTHS)  # in words
INSIDE, OUTSIDE, PARTLY = ("inside the paper's grid", "outside the paper's grid",
                           "partly inside the paper's grid")

# (claim label in nopelib.rules, the paper's statement), in the scorecard's order; the chapter
# and section that judge each come from the chapters' specs (``chapters.section_of``)
PAPER_CLAIMS = (
    (init_claims.LAYER0, "Layer 0 (the token embeddings) scores about 0.5."),
    (init_claims.LAYER1, "After the first causal attention layer the score jumps to 0.8-1.0."),
    (init_claims.EVERY_TASK, "The pattern holds before training, for every task."),
    (init_claims.THE_GRID, "It holds for 6-24 layers and 192-768 widths."),
    (claims.AFTER_TRAINING, "It holds after training, for every task."),
    (init_claims.SMALL_SIGMA, "An initialisation with sigma <= 0.02 keeps it stable."),
    (init_claims.LARGE_SIGMA, "At sigma = 0.2 it is gone."),
    (init_claims.MEANS, "The means 0, 4 and 8 have little effect."),
    (claims.FIRST_KEEP, "Trained models keep a strong pattern in the first layers."),
    (claims.LATER_WEAKEN, "It weakens in later layers."),
    (init_claims.PROBE_RANDOM, "Cosine-similarity features predict position better than "
     "variance features (random initialisation)."),
    (init_claims.PROBE_RANDOM_MLP, "The same, with the paper's probe (a 4-layer MLP)."),
    (init_claims.PROBE_TRAINED, "The same for trained models."),
    (beyond_claims.SHORT_INPUTS, "A limit the authors admit: sequences of about 30 tokens "
     "only."),
)
# (claim label, the paper's statement, chapter page, section anchor) per claim
PAPER_ROWS = tuple((claim, paper, *section_of(claim)) for claim, paper in PAPER_CLAIMS)
SPECS = {spec[0]: spec for spec in PAPER_ROWS}
# the probe claim's reading (init_claims.probe_claims: both metrics at every layer from 1)
PROBE_READING = "cosine features: lower NRMSE and higher R, every layer from 1"
NOT_TRAINED = "not yet trained"


# ---------------------------------------------------------------------------------------------
# the model of a row


def in_paper_grid(config: GPTConfig) -> bool:
    """Whether ``config`` is a model of the paper's grid: a causal decoder with no position
    encoding, 6 to 24 layers and 192 to 768 wide (the paper's result 2). The initialisation is not part of
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


def span_text(values: Sequence[float]) -> str:
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
    init = f"σ {span_text(stds)}" if not any(means) else f"mean {span_text(means)}, σ {span_text(stds)}"
    init = f"token-embedding {init}" if targets == {"embedding"} else f"{init} on every weight"
    label = (f"{span_text([c.n_layer for c in configs])} layers × "
             f"{span_text([c.n_embd for c in configs])} wide, {init}")
    encodings = sorted({c.pos_encoding for c in configs} - {"none"})
    if encodings:
        label += f", {' or '.join(encodings)} position encoding"
    if not any(c.causal for c in configs):
        label += ", bidirectional"
    elif not all(c.causal for c in configs):
        label += ", causal or bidirectional"
    return label


def model_of(configs: GPTConfig | Sequence[GPTConfig], note: str = "") -> tuple[str, str]:
    """A row's (model label, grid words) for ``configs``, ``note`` appended to the label."""
    configs = [configs] if isinstance(configs, GPTConfig) else list(configs)
    return model_label(configs) + note, grid_status([in_paper_grid(c) for c in configs])


# ---------------------------------------------------------------------------------------------
# the rows


def link(page: str, anchor: str) -> str:
    """The link to a chapter's section; an ``anchor`` written ``"<page>/<anchor>"`` lies on
    a page of the chapter's own (``chapters``: a chapter split into pages)."""
    page, _, anchor = anchor.rpartition("/") if "/" in anchor else (page, "", anchor)
    return f'<a href="{page}.html#{anchor}">{page.replace("_", " ")}</a>'


def layer_suffix(group: str, layer: int, sep: str = ", ") -> str:
    """What a test's label adds to its group's name: ``sep`` and its layer, unless the group
    names its layer already (a probe's) or the test reads the model as a whole (layer -1, as
    the rules write it: a loss, a rise in bits per character)."""
    return "" if "layer" in group or layer < 0 else f"{sep}layer {layer}"


def make_row(spec: tuple[str, str, str, str], reading: str, model: tuple[str, str],
             table: pd.DataFrame | None, by: str, evidence: str, note: str = "",
             in_flight: Sequence[str] = (), unit: str = "", suffix: str = "") -> dict:
    """The scorecard row of one reading of a claim (``spec``: a PAPER_ROWS entry) on one
    ``model`` (``model_of``'s label and grid words) from the reading's ``claims.claim_table``
    rows (None or empty: untested, ``note`` as the measurement; a judged row never shows
    ``note``): its groups (``by``) combined by ``claims.overall``, the weakest group's interval
    as the measurement, ``suffix`` after it (what of the study was left out). ``in_flight``
    names the tasks the claim covers that are not in yet ("addition (still training: 2 of 5
    seeds in)"): each counts as "cannot tell" until it is in, so a claim about every task never
    reads "replicates" on the tasks that happen to be in first; and a "fails" or "partly"
    beside them is marked provisional, its correction growing with the tests to come.
    ``unit`` names what a group is where its name does not ("tasks", "layers")."""
    claim, paper, page, anchor = spec
    row = dict(claim=claim, reading=reading, model=model[0], grid=model[1], paper=paper,
               section=link(page, anchor), in_flight=len(in_flight))
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
    more = f"{len(in_flight)} more task" + ("s" if len(in_flight) > 1 else "")
    waiting = f"; cannot tell yet on {more}: {', '.join(in_flight)}" if in_flight else ""
    side = ">" if worst["above"] else "<"
    where = str(worst[by]) + layer_suffix(str(worst[by]), int(worst["weakest_layer"]))
    measured = (f"{tally} of {len(per_group)}{' ' + unit if unit else ''}{waiting}; "
                f"nearest to failing: {where}, "
                f"{worst['mean']:.3f} [{worst['lo']:.3f}, "
                f"{worst['hi']:.3f}] (the claim: {side} {worst['bound']:g})")
    evidence += (f"; {int(table['n'].min())} seeds, one-sided t bounds: holds at level "
                 f"{1 - worst['holds_level']:g} per test, fails Bonferroni over "
                 f"{int(worst['m'])} tests")
    groups = table.rename(columns={by: "group"})[list(GROUP_COLUMNS)]
    verdict = claims.overall([*per_group, *["cannot tell"] * len(in_flight)])
    if in_flight and verdict in ("fails", "partly"):
        measured += ("; provisional: the tasks to come add tests to the correction that "
                     "\"fails\" passed")
    return dict(row, measured=measured + suffix, verdict=verdict, evidence=evidence,
                groups=groups)


def init_rows(ev: Mapping[str, pd.DataFrame], p: Mapping[str, object]) -> list[dict]:
    """The rows of results 1 to 3 (random initialisation) from the random-initialisation
    chapter's studies ``ev`` (``base``, ``init``, ``grid``: ``chapters.init_base`` etc.), one per
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
    models = {  # claim -> (model, evidence)
        init_claims.THE_GRID: (model_of(grid, ", the grid"), grid_live),
        init_claims.SMALL_SIGMA: (model_of(sigmas(lambda s: s <= 0.02), study_note), sigma_live),
        init_claims.LARGE_SIGMA: (model_of(sigmas(lambda s: s >= 0.2), study_note), sigma_live),
        init_claims.MEANS: (model_of(sigmas(lambda s: s <= 0.02), study_note), sigma_live),
    }
    rows = []
    for claim, reading in init_claims.INIT_CLAIMS:
        model, evidence = models.get(claim, (model_of(base), live))
        mine = table[(table.claim == claim) & (table.reading == reading)]
        rows.append(make_row(SPECS[claim], reading, model, mine, "group", evidence))
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
    "untested" where there is none or no study ("not yet trained"). A task whose seeds are
    not all in yet (a study in flight), or whose file is stale, is named in the row and counts
    as "cannot tell" until it is in (``make_row``'s ``in_flight``). Also returns what the
    probe rows need: the profile, its model, the study's files, the judged tasks, the tasks
    in flight and the note an untested row gives."""
    prof = PROFILES[profile]
    n_seeds = len(prof.seeds)
    model = model_of(prof.model, f", trained ({profile} profile)")
    docs, _ = committed.load_study(profile, tasks)
    evidence = f"committed study, {profile} profile, whole test split ({prof.n_test:,})"
    info = dict(profile=profile, model=model, docs=docs, judged=[], in_flight=[], note="")
    if not docs:
        stale = committed.stale_tasks(profile, tasks)
        note = NOT_TRAINED if not stale else (
            f"committed study of {', '.join(stale)} stale (trained under an earlier profile)")
        info["note"] = note
        return [make_row(SPECS[c], r, model, None, "task", f"no committed study of the "
                         f"{profile} profile", note) for c, r in claims.TRAINED_CLAIMS], info
    # a study in flight holds fewer seeds than its profile: a task is judged at all of them
    acc = trained_tables.study_accuracy(trained_tables.study_table(docs), prof.n_test,
                                        n_seeds=n_seeds)
    _, judged = trained_tables.learned_and_judged(acc)
    # a task still training, or stale, is "cannot tell" until it is in; one that is in but
    # not learned with margin is not judged (the rule), and the note names it
    standing = trained_tables.task_standing(acc, tasks, n_seeds,
                                            committed.stale_tasks(profile, tasks))
    in_flight = [f"{t} ({why})" for t, why in standing.items()
                 if why.startswith(("still training", "stale"))]
    left = [f"{t} ({why})" for t, why in standing.items() if why.startswith("not learned")]
    note = f"; not judged: {', '.join(left)}" if left else ""
    verdicts = trained_tables.trained_verdicts(docs, acc)[1] if judged else None
    untested = (f"no task judged yet: {', '.join(in_flight)}"
                if in_flight else "no trained task learned with margin")
    info.update(judged=judged, in_flight=in_flight, note=untested)
    rows = []
    for claim, reading in claims.TRAINED_CLAIMS:
        mine = None if verdicts is None else verdicts[(verdicts.claim == claim)
                                                      & (verdicts.reading == reading)]
        rows.append(_tag_groups(make_row(SPECS[claim], reading, model, mine, "task", evidence,
                                         note if judged else untested + note, in_flight,
                                         unit="tasks", suffix=note), profile))
    return rows, info


PAPER_MODEL_PROFILE = "paper_study"  # the paper's own model's study
PAPER_MODEL_PROBES = "the-paper-s-own-model"  # its section of the probes chapter


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
    base = model_of(GPTConfig())
    rows = [_probe_row(ridge_spec, base, comp.reset_index().assign(group="random init"),
                       f"{live}, ridge probe on {pp['n_fit_tokens']:,} fitting tokens"),
            _probe_row(mlp_spec, base, mlp_comp.reset_index().assign(group="random init"),
                       f"{live}, MLP probe on {pp['mlp_fit_tokens']:,} fitting tokens")]
    for info in trained:
        # the paper's own model has its own section of the probes chapter
        spec = (trained_spec if info["profile"] != PAPER_MODEL_PROFILE
                else (*trained_spec[:3], PAPER_MODEL_PROBES))
        if not info["judged"]:
            rows.append(make_row(spec, PROBE_READING, info["model"], None, "group",
                                 f"committed study, {info['profile']} profile", info["note"]))
            continue
        # the probes chapter's trained verdict: each layer minus the same model's layer 0
        comp = trained_comparison(info["docs"], info["judged"], subtract_format=True
                                  ).reset_index().rename(columns={"task": "group"})
        rows.append(_tag_groups(_probe_row(
            spec, info["model"], comp, f"committed study's models, {info['profile']} "
            "profile, the model as the unit, format-subtracted (each layer minus the same "
            "model's layer 0)", info["in_flight"]), info["profile"]))
    return rows


def _probe_row(spec: tuple[str, str, str, str], model: tuple[str, str], comp: pd.DataFrame,
               evidence: str, in_flight: Sequence[str] = ()) -> dict:
    """A probe comparison's row: one test per (group, layer) on the NRMSE difference (cosine
    minus variance; the claim says below 0), its verdict the layer's (both metrics)."""
    verdict = comp.verdict.map({"cosine": "holds", "variance": "fails"}).fillna("cannot tell")
    table = pd.DataFrame(dict(
        claim=spec[0], reading=PROBE_READING, group=comp["group"] + ", layer "
        + comp["layer"].astype(str), weakest_layer=comp["layer"], mean=comp["d_nrmse"],
        lo=comp["d_nrmse lo"], hi=comp["d_nrmse hi"], bound=0.0, above=False, n=comp["n"],
        m=comp["m"], holds_level=comp["holds_level"], fails_level=comp["fails_level"],
        verdict=verdict))
    unit = "layers" if comp["group"].nunique() == 1 else "task-layer pairs"
    return make_row(spec, PROBE_READING, model, table, "group", evidence,
                    in_flight=in_flight, unit=unit)
