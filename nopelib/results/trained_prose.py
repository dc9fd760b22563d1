"""The committed trained-model study in words: where its runs came from, what its verdicts say.

A file's provenance (``study_provenance``, ``run_origins``), how two models differ
(``profile_differences``) and whether a verdict depends on the model (``model_dependence``),
the verdicts and starting points as sentences (``verdict_summary``, ``starting_points``), and a
live run beside the study (``reproduction_summary``): a chapter cell states what it shows, and
this module how it is worded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict

import numpy as np
import pandas as pd

from nopelib.rules import claims
from nopelib.training.task_precision import task_profile
from nopelib.training.train_profile import TrainProfile


def study_provenance(doc: Mapping) -> str:
    """Markdown: where a committed study file's numbers come from: the invocation that wrote
    it, then where its runs came from, from each run's ``origin``; a file written before
    runs recorded one says what its writer did and where the other runs came from."""
    p, runs = doc["provenance"], doc["runs"]
    wrote = (f"the file written (not its runs trained, unless said below) by "
             f"`{p['command']}` at commit `{p['commit'][:12]}` on {p['machine']} "
             f"(CPU kernels {p.get('cpu_capability', '?')}, torch {p['torch']}, "
             f"{p['wall_seconds'] / 60:.0f} min wall, {p['date']})")
    if all("origin" in r for r in runs):
        return f"{wrote}; " + "; ".join(run_origins(runs))
    return (f"{wrote}; of the seeds it ran (those its command names, else the profile's) it "
            f"read {p['runs_from_cache']} from the run cache and trained the others; any "
            "other run was kept from the committed file it grew (files of this age do not "
            "record each run's origin)")


def run_origins(runs: Sequence[Mapping]) -> list[str]:
    """Where ``runs`` came from (their ``origin``), one phrase per invocation that trained
    some and one for those read from the run cache, seeds named, each with the dates the
    runs finished."""
    groups: dict[tuple, list[Mapping]] = {}
    for r in runs:
        o = r["origin"]
        by = (o.get("command"), o["commit"], o["machine"], o["cpu_capability"]) if (
            o["how"] == "trained") else ()
        groups.setdefault(by, []).append(r)
    phrases = []
    for by, group in groups.items():
        seeds = ", ".join(str(r["seed"]) for r in group)
        dates = sorted(r["origin"]["finished"] for r in group)
        when = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"
        label = f"seed{'s' if len(group) > 1 else ''} {seeds}"
        if by:
            command = f" by `{by[0]}`" if by[0] else ""  # a study command names itself
            phrases.append(f"{label} trained{command} at commit `{by[1][:12]}` on {by[2]} "
                           f"(CPU kernels {by[3]}), finished {when}")
        else:
            phrases.append(f"{label} read from the run cache, trained at a commit it does not "
                           "record (nor the command; the run key pins the training sources, "
                           f"torch and precision), finished {when}")
    return phrases


DIFFERS = "differs between the models"  # model_dependence's column


# how a profile field is named where two models are compared
FIELD_WORDS = {"n_layer": "layers", "n_head": "heads", "n_embd": "width",
               "init_std": "token-embedding σ", "n_trajectory": "trajectory inputs",
               "curve_dense_every": "dense curve points every (steps)",
               "curve_dense_until": "dense curve points until (step)"}


def profile_differences(a: TrainProfile, b: TrainProfile,
                        tasks: Sequence[str] = ()) -> list[str]:
    """Every way the models of profiles ``a`` and ``b`` differ, in words ("width 96 vs
    384"): the model's configuration, the profile's fields, and the precision each of
    ``tasks`` trains in (``task_profile``), so that a comparison never names size alone."""
    out = []
    ma, mb = asdict(a.model), asdict(b.model)
    out += [f"{FIELD_WORDS.get(k, k)} {ma[k]:g} vs {mb[k]:g}" for k in ma if ma[k] != mb[k]]
    pa, pb = asdict(a), asdict(b)
    skip = {"name", "model", "seeds", "precision", "claim_tasks"}
    out += [f"{FIELD_WORDS.get(k, k)} {pa[k]} vs {pb[k]}" for k in pa
            if k not in skip and pa[k] != pb[k]]
    for task in tasks:
        pre = (task_profile(a, task).precision, task_profile(b, task).precision)
        if pre[0] != pre[1]:
            out.append(f"precision on {task} {pre[0]} vs {pre[1]}")
    return out


def model_dependence(tables: Mapping[str, pd.DataFrame | None], tasks: Sequence[str],
                    standing: Mapping[str, Mapping[str, str]] | None = None) -> pd.DataFrame:
    """Whether a trained claim's verdict differs between two models (which differ in more than
    size: ``profile_differences`` names how): ``tables`` maps a model's
    name to its claim table (``trained_verdicts``' second item, None when the model has no
    judged task), the first name being the reference; ``standing`` maps a name to
    ``task_standing``'s reasons, which stand in a model's column where it has no verdict
    ("not judged" without them). A table's exploratory rows are no verdict. One row per
    (claim, reading, task) with each model's verdict and one plain sentence where every model
    has a verdict: "yes" where one model holds and another fails, "no" where all hold or all
    fail, "not shown" where a model cannot tell (missing evidence, not another finding); and
    where one has none, "cannot say yet" while it still trains on the task, "cannot say"
    where it never will under its profile."""
    names = list(tables)
    if len(names) < 2:
        raise ValueError(f"model_dependence: two models or more, not {names}")
    keys = ["claim", "reading", "task"]
    every = "both models" if len(names) == 2 else f"all {len(names)} models"
    rows = []
    for (claim, reading), task in ((cr, t) for cr in claims.TRAINED_CLAIMS for t in tasks):
        row = dict(claim=claim, reading=reading, task=task)
        for name in names:
            table = tables[name]
            if table is not None and "standing" in table:
                table = table[table["standing"] == "verdict"]
            hit = (None if table is None else
                   table[(table[keys] == [claim, reading, task]).all(axis=1)])
            why = (standing or {}).get(name, {}).get(task, "not judged")
            row[name] = why if hit is None or hit.empty else hit.verdict.iloc[0]
        verdicts = [row[n] for n in names]
        missing = [n for n in names if row[n] not in claims.VERDICTS]
        if missing:
            lead = ("cannot say yet" if any(row[n].startswith("still training")
                                            for n in missing) else "cannot say")
            has = "has" if len(missing) == 1 else "have"
            row[DIFFERS] = f"{lead}: {', '.join(missing)} {has} no verdict on {task}"
        elif {"holds", "fails"} <= set(verdicts):
            row[DIFFERS] = "yes: " + ", ".join(f"{row[n]} at {n}" for n in names)
        elif set(verdicts) == {"holds"} or set(verdicts) == {"fails"}:
            row[DIFFERS] = f"no: {verdicts[0]} on {every}"
        else:  # a "cannot tell" is missing evidence, not another finding
            row[DIFFERS] = "not shown: " + ", ".join(
                f"{row[n]} at {n}" for n in names)
        rows.append(row)
    return pd.DataFrame(rows)


def verdict_summary(verdicts: pd.DataFrame) -> str:
    """Markdown: one item per row of ``claims.claim_table`` (with a ``paper`` column, and a
    ``standing`` one when the table may be exploratory), the weakest test as evidence, and how
    many readings go against the paper, on which tasks."""
    exploratory = "standing" in verdicts and (verdicts["standing"] != "verdict").any()
    tag = " (exploratory)" if exploratory else ""
    lines = [f"- **{r['task']}**, {r['claim']} ({r['reading']}): **{r['verdict']}**{tag} "
             f"(paper: {r['paper']}); weakest layer {r['weakest_layer']}: "
             f"{r['mean']:.3f}, bounds [{r['lo']:.3f}, {r['hi']:.3f}] "
             f"(one-sided, at {r['holds_level']:.4f} and {r['fails_level']:.4f}), "
             f"{r['n']} seeds."
             for _, r in verdicts.iterrows()]
    against = verdicts[verdicts.verdict == "fails"]
    lead = ("Exploratory, not a verdict (no task meets the margin rule): against the paper "
            if exploratory else "Against the paper: ")
    judged_on = ", ".join(dict.fromkeys(verdicts["task"]))
    lines.append(f"\n{lead}{len(against)} of {len(verdicts)} readings (on {judged_on})"
                 + (": " + "; ".join(f"{r.task}, {r.reading}"
                                     for r in against.itertuples())
                    if len(against) else "") + ".")
    return "\n".join(lines)


def starting_points(before: Mapping[str, np.ndarray]) -> str:
    """Markdown: each task's layer-1 score at initialisation (``before``: per task, scores
    [seeds, L+1] of the models the claims are judged on), mean over seeds and lowest seed,
    and the tasks that start below the "keeps" bound (``claims.KEEPS_AT``), where "layer 1 at
    least KEEPS_AT through the learned phase" can fail without training losing anything."""
    start = {t: np.asarray(b, dtype=np.float64)[:, 1] for t, b in before.items()}
    parts = [f"{t} {v.mean():.3f} (lowest seed {v.min():.3f})" for t, v in start.items()]
    low = [t for t, v in start.items() if v.mean() < claims.KEEPS_AT]
    text = f"Layer 1 at initialisation, mean over seeds: {'; '.join(parts)}. "
    if not low:
        return text + (f"Every task starts at or above the \"keeps\" bound "
                       f"({claims.KEEPS_AT:g}).")
    return text + (f"On {', '.join(low)} the initialisation itself is below the \"keeps\" "
                   f"bound ({claims.KEEPS_AT:g}): there, \"layer 1 at least "
                   f"{claims.KEEPS_AT:g} through the learned phase\" can fail without "
                   "training losing a pattern the model had; the last-layer readings, "
                   "measured against the same model's layer 1 and initialisation, do not "
                   "depend on the bound.")


def reproduction_summary(task: str, seed: int, live: Mapping[str, object],
                         check: pd.DataFrame, committed: Sequence[Mapping]) -> str:
    """Markdown: what ``reproduction`` found for one live run, with the budgets beside it (a
    run's scores after training move with the length of its training, and under other CPU
    kernels the progress-following budget can end elsewhere)."""
    steps = [r["steps"] for r in committed]
    head = (f"**{task} seed {seed}**: exact match {live['accuracy']:.4f} after "
            f"{live['steps']:,} steps (the study's {len(steps)} runs: {min(steps):,} to "
            f"{max(steps):,}); ")
    out = check[~check.inside]
    if out.empty:
        return head + "every layer inside the study's interval for one more seed."
    return head + "**outside** the study's interval for one more seed at " + "; ".join(
        f"{r.quantity} ({r.live:.3f}, interval [{r.lo:.3f}, {r.hi:.3f}])"
        for r in out.itertuples()) + "."

