"""The trained-model study: what the trained chapter computes from a profile's trained runs.

- the profile's initial pattern (``initial_pattern``): the embedding ratio rho, the layer-1
  adjacency score the averaging theory predicts at initialisation, and the score measured;
- the runs' accuracy (``run_table``, ``accuracy_table``) and where each learning curve reached
  the learnedness line for good (``plateau_table``, by ``claims.past_plateau``);
- the committed recipe study: where its learning curves leave their plateau
  (``leaves_plateau``), and how its budget compares with today's profile (``recipe_budgets``);
- the adjacency score of every layer before and after training (``scores_before_after``,
  ``score_table``), on which ``nopelib.claims`` judges the paper's claims, and the same per
  budget of a committed budget study (``budget_verdicts``);
- the sentences the chapter prints from these numbers (``verdict_summary`` and its kin), so
  that a chapter cell states what it shows and this module how it is worded.

The chapter's parameters and their rules (``CHAPTER_PARAMS``) are here too, so that its check
cell stays short. Nothing here trains: the runs come from ``nopelib.launch.train_many``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from nopelib import claims
from nopelib.analysis import is_learned, layer_scores, random_model, sample_inputs
from nopelib.model import GPTConfig
from nopelib.params import SEED, Choice, Device, Int, ListOf, Optional
from nopelib.profiles import PROFILES, TrainProfile
from nopelib.stats import summarize
from nopelib.tasks import TASKS, encode_inputs, make_split, majority_baseline
from nopelib.theory import embedding_ratio, predict_layer1_score
from nopelib.theory_studies import measure_value_scale

# The trained chapter's parameters (its ``parameters`` cell: edit the two together). Upper
# bounds: rough costs on the 2-core development machine, far above the defaults; the reason is
# in each message.
CHAPTER_PARAMS = {
    "profile": Choice(PROFILES),
    "seeds": Optional(ListOf(SEED, unique=True, max_len=50,
                             why="each seed trains one run per task, ~2.6 min on one core for "
                                 "the cpu profile: ~4.3 h for 50 seeds x 4 tasks on 2 cores")),
    "tasks": ListOf(Choice(TASKS), unique=True),
    "n_analysis": Int(min=1, max=4096, why="each input is scored by every trained model and "
                      "its initialisation, ~10 ms each for the paper's base model: ~16 min at "
                      "4096 with 3 seeds and 4 tasks"),
    "heatmap_task": Choice(TASKS).where(lambda t, p: t in p["tasks"], "one of tasks"),
    "device": Device(),
}

INIT_INPUTS = 16  # task inputs per task for the initial-pattern measurement
INIT_SEED = 99  # their seed
VALUE_SCALE_INPUT_SEED = 98  # the reversal input the value scale is measured on
VALUE_SCALE_STD = 0.2  # init std of the model that measures the value scale (sigma^2 >> eps)
ANALYSIS_SEED = 12345  # seed of the analysis inputs scored before and after training
PLATEAU_MARGIN = 0.1  # a curve leaves its plateau this far above the majority-answer share


# ---------------------------------------------------------------------------------------------
# the initial pattern


def init_row(name: str, config: GPTConfig, tasks: Sequence[str],
             seeds: Sequence[int]) -> dict:
    """The initial pattern of one architecture: its embedding ratio rho, the layer-1 score the
    averaging theory predicts from it (nothing fitted), and the mean layer-1 score measured on
    ``INIT_INPUTS`` inputs of every task over the initialisations of ``seeds``."""
    texts = [t for task in tasks for t in sample_inputs(task, INIT_INPUTS, seed=INIT_SEED)]
    ids = [encode_inputs([t])[0][0].tolist() for t in texts]
    probe_idx, _ = encode_inputs(
        sample_inputs("reversal", 8, seed=VALUE_SCALE_INPUT_SEED)[:1])
    big = random_model(config, seed=0, init_std=VALUE_SCALE_STD)  # the value scale
    s_inf = measure_value_scale(big, probe_idx)
    rho = float(embedding_ratio(config.init_std, s_inf, config.n_embd))
    measured = np.mean([layer_scores(random_model(config, seed=s), texts)[:, 1].mean()
                        for s in seeds])
    predicted = predict_layer1_score(ids, config.init_std, s_inf, config.n_embd)
    return dict(model=name, layers=config.n_layer, width=config.n_embd,
                sigma_e=config.init_std, rho=rho, predicted=predicted,
                measured=measured)


def initial_pattern(configs: Mapping[str, GPTConfig], tasks: Sequence[str],
                    seeds: Sequence[int]) -> pd.DataFrame:
    """``init_row`` of every named architecture in ``configs``: one row per model (the index),
    columns layers, width, sigma_e, rho, predicted, measured."""
    return pd.DataFrame([init_row(name, config, tasks, seeds)
                         for name, config in configs.items()]).set_index("model")


# ---------------------------------------------------------------------------------------------
# accuracy and the plateau


def run_table(runs: Mapping[tuple[str, int], object], prof: TrainProfile) -> pd.DataFrame:
    """One row per trained run (``runs`` maps (task, seed) to a ``runs.TrainedRun``): task,
    seed, exact match on the test split, its size, the majority-answer share of that split,
    steps, training seconds, ms per step and device."""
    rows = []
    for (task, seed), run in runs.items():
        m = run.metrics
        test = make_split(task, seed, n_train=prof.n_train, n_test=prof.n_test).test
        rows.append(dict(task=task, seed=seed, accuracy=m["accuracy"], n_test=m["n_test"],
                         majority=majority_baseline(test)[1], steps=m["steps"],
                         train_s=m["train_seconds"], step_ms=m["step_ms"],
                         device=m["device"]))
    return pd.DataFrame(rows)


def accuracy_table(per_run: pd.DataFrame, prof: TrainProfile, tasks: Sequence[str],
                   seeds: Sequence[int]) -> pd.DataFrame:
    """Exact match per task (rows, in ``tasks`` order) and seed (columns ``seed s``) from
    ``run_table``, with the task's majority-answer share, steps, test size, whether it is
    learned (``analysis.is_learned``: every seed, the whole test split) and whether it is in
    the profile's claim set."""
    acc = per_run.pivot(index="task", columns="seed", values="accuracy").loc[list(tasks)]
    acc.columns = [f"seed {s}" for s in acc.columns]
    by_task = per_run.groupby("task").agg(
        majority=("majority", "mean"), steps=("steps", "first"), n_test=("n_test", "min"))
    acc = acc.join(by_task.loc[list(tasks)])
    metrics = {(r.task, r.seed): dict(accuracy=r.accuracy, n_test=r.n_test)
               for r in per_run.itertuples()}
    acc["learned"] = [is_learned([metrics[task, s] for s in seeds], prof.n_test)
                      for task in tasks]
    acc["claim set"] = [t in prof.claim_tasks for t in tasks]
    return acc


def plateau_table(runs: Mapping[tuple[str, int], object], tasks: Sequence[str],
                  seeds: Sequence[int]) -> pd.DataFrame:
    """Where each run's learning curve reached ``analysis.LEARNED_AT`` for good and the share
    of its budget left after it (``claims.past_plateau``): one row per (task, seed)."""
    rows = []
    for task in tasks:
        for s in seeds:
            m = runs[task, s].metrics
            rows.append(dict(task=task, seed=s, steps=m["steps"], **claims.past_plateau(
                m["curve"]["step"], m["curve"]["accuracy"], m["steps"])))
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------
# the recipe study (committed results)


def leaves_plateau(run: Mapping, baselines: Mapping[str, float],
                   margin: float = PLATEAU_MARGIN) -> int | None:
    """The first step of ``run``'s learning curve whose exact match exceeds its task's
    majority-answer share (``baselines``; 0 for a task without one) by ``margin``, or None."""
    floor = baselines.get(run["task"], 0.0) + margin
    curve = zip(run["curve"]["step"], run["curve"]["accuracy"])
    hits = [step for step, accuracy in curve if accuracy > floor]
    return hits[0] if hits else None


def recipe_budgets(recipe: Mapping, prof: TrainProfile) -> list[str]:
    """One line per task of a committed recipe study: the training settings its provenance
    records beside today's profile ``prof``, in examples seen per run (steps x batch), and the
    study's budget as a multiple of today's."""
    then = TrainProfile.from_record(recipe["provenance"]["training"])
    lines = []
    for task in sorted({r["task"] for r in recipe["runs"]}):
        was, now = then.for_task(task), prof.for_task(task)
        seen_then, seen_now = was.steps * was.batch_size, now.steps * now.batch_size
        ratio = recipe["provenance"]["scale"] * seen_then / seen_now
        lines.append(f"  {task}: the study's profile then: batch {was.batch_size}, "
                     f"lr {was.lr}, "
                     f"{seen_then:,} examples per run; today's {prof.name} profile: "
                     f"batch {now.batch_size}, lr {now.lr}, {seen_now:,} examples per run "
                     f"(the study saw {ratio:.1f} x today's budget)")
    return lines


def recipe_table(studies: Mapping[str, Mapping],
                 baselines: Mapping[str, float]) -> pd.DataFrame:
    """Every run of the committed recipe studies (``results.load_all("recipe")``), one row
    each, without its curve and with the step where it leaves its plateau
    (``leaves_plateau_at``)."""
    return pd.DataFrame([{"file": name, **{k: v for k, v in r.items() if k != "curve"},
                          "leaves_plateau_at": leaves_plateau(r, baselines)}
                         for name, recipe in studies.items() for r in recipe["runs"]])


def recipe_summary(recipe_runs: pd.DataFrame, baselines: Mapping[str, float]) -> str:
    """Markdown: one item per (task, seed) of ``recipe_table``, NoPE's final exact match
    beside the learned position embedding's and the majority-answer share."""
    final = recipe_runs.pivot_table(index=["task", "seed"], columns="pos_encoding",
                                    values=["accuracy", "steps"])
    return "\n".join(
        f"- **{task}**, seed {seed}, {int(row[('steps', 'none')]):,} steps: "
        f"NoPE {row[('accuracy', 'none')]:.3f}, learned position "
        f"{row[('accuracy', 'learned')]:.3f} exact match "
        f"(majority answer {baselines.get(task, float('nan')):.3f})"
        for (task, seed), row in final.iterrows())


# ---------------------------------------------------------------------------------------------
# adjacency scores before and after training


def scores_before_after(config: GPTConfig, runs: Mapping[tuple[str, int], object],
                        tasks: Sequence[str], seeds: Sequence[int],
                        n_analysis: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Per-seed adjacency scores [seeds, L+1] of every task (mean over ``n_analysis`` inputs,
    the same for every model, drawn with ``ANALYSIS_SEED``): before training (the
    initialisation of the seed, architecture ``config``) and after (the trained run)."""
    before, after = {}, {}
    for task in tasks:
        texts = sample_inputs(task, n_analysis, seed=ANALYSIS_SEED)
        initial = [random_model(config, seed=s) for s in seeds]
        # [seeds, L+1]: mean over the inputs of each model
        before[task] = np.stack([layer_scores(m, texts).mean(0) for m in initial])
        after[task] = np.stack([layer_scores(runs[task, s].model, texts).mean(0)
                                for s in seeds])
    return before, after


def score_table(before: Mapping[str, np.ndarray], after: Mapping[str, np.ndarray],
                layers: Sequence[int]) -> pd.DataFrame:
    """Mean over seeds of the scores before and after training: one row per layer, columns
    (task, "before" / "after")."""
    return pd.DataFrame(
        {(task, when): summarize(s)[0] for task in before
         for when, s in (("before", before[task]), ("after", after[task]))},
        index=pd.Index(layers, name="layer"))


def verdict_summary(verdicts: pd.DataFrame) -> str:
    """Markdown: one item per row of ``claims.claim_table`` (with a ``paper`` column), the
    weakest test as evidence, and how many readings go against the paper."""
    lines = [f"- **{r['task']}**, {r['claim']} ({r['reading']}): **{r['verdict']}** "
             f"(paper: {r['paper']}); weakest layer {r['weakest_layer']}: "
             f"{r['mean']:.3f}, interval [{r['lo']:.3f}, {r['hi']:.3f}] "
             f"at level {r['level']:.4f}, {r['n']} seeds."
             for _, r in verdicts.iterrows()]
    against = verdicts[verdicts.verdict == "fails"]
    lines.append(f"\nAgainst the paper: {len(against)} of {len(verdicts)} readings"
                 + (": " + "; ".join(f"{r.task}, {r.reading}"
                                     for r in against.itertuples())
                    if len(against) else "") + ".")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# the budget study (committed results)


def budget_verdicts(budget: Mapping, n_test: int) -> tuple[list[dict], dict[str, tuple]]:
    """One committed budget study (``results.load_all("budget")``): per (task, steps) a row
    with the seeds, the lowest exact match, learnedness, the mean layer-1 and last-layer
    scores after training and, where learned, the verdict of every trained-model reading
    (``claims.trained_claims`` on that budget's seeds); and per budget the (mean, std) of the
    scores before and after training, for ``viz.before_after_lines``."""
    rows, stats = [], {}
    for (task, steps), group in pd.DataFrame(budget["runs"]).groupby(["task", "steps"]):
        scores = np.stack(group["before"]), np.stack(group["after"])  # [seeds, L+1]
        learned_here = is_learned(group.to_dict("records"), n_test)
        row = dict(task=task, steps=steps, seeds=len(group),
                   min_accuracy=group["accuracy"].min(), learned=learned_here,
                   layer1=scores[1][:, 1].mean(), last=scores[1][:, -1].mean())
        if learned_here:
            table_here = claims.claim_table(claims.trained_claims(
                {task: scores[0]}, {task: scores[1]}, [task]))
            row.update(zip(table_here.reading, table_here.verdict))
        rows.append(row)
        stats[f"{task}, {steps:,} steps"] = tuple(summarize(s) for s in scores)
    return rows, stats


def budget_summary(by_budget: pd.DataFrame) -> str:
    """Markdown: per task of the budget table (indexed by task and steps), every budget's
    verdict per reading, or that its models did not learn the task."""
    lines = []
    readings = [reading for _, reading in claims.TRAINED_CLAIMS]
    for task, task_rows in by_budget.groupby(level="task"):
        verdicts_at = {steps: "; ".join(f"{k}: {r[k]}" for k in readings)
                       if r["learned"] else "not learned, no verdict"
                       for (_, steps), r in task_rows.iterrows()}
        per_budget = " | ".join(f"{steps:,} steps: {v}"
                                for steps, v in verdicts_at.items())
        lines.append(f"- **{task}** (committed): {per_budget}.")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# the paper's grid (committed summaries)

# the command that produces each grid's summary, from the repository root
GRID_COMMANDS = {
    "paper-base": "python -m nopelib.grid paper-base --device cuda --batched "
                  "--out book/results/grid_paper-base.json",
    "paper": "python -m nopelib.grid paper --address auto "
             "--out book/results/grid_paper.json",
}


def grid_caption(name: str, provenance: Mapping, n_runs: int) -> str:
    """Markdown: a committed grid summary's size and provenance."""
    return (f"Grid `{name}` (committed): {n_runs} runs, trained by "
            f"`{provenance['command']}` at commit `{provenance['commit'][:12]}` on "
            f"{provenance['machine']} (torch {provenance['torch']}, backend "
            f"{provenance['backend']}, {provenance['wall_seconds'] / 60:.1f} min wall, "
            f"{provenance['date']}).")
