"""The trained-model study: what the trained chapter computes from a profile's trained runs.

- the profile's initial pattern (``initial_pattern``): the embedding ratio rho, the layer-1
  adjacency score the averaging theory predicts at initialisation, and the score measured;
- the committed trained-model study (``nopelib.studies.trained_study``): its files (``load_study``),
  accuracy and where each run was learned for good (``study_table``, ``study_accuracy``), the
  adjacency scores at initialisation, after training and over the learned phase
  (``study_scores``, ``score_table``), on which ``nopelib.rules.claims`` judges the paper's claims,
  and a live run set beside the study (``reproduction``, ``reproduction_summary``,
  and under two CPU kernel sets: ``kernel_check``);
- the committed recipe study: where its learning curves leave their plateau
  (``leaves_plateau``), and how its budget compares with today's profile (``recipe_budgets``);
- the sentences the chapter prints from these numbers (``verdict_summary`` and its kin), so
  that a chapter cell states what it shows and this module how it is worded.

The rules of the chapter's parameters (``CHAPTER_PARAMS``) are here too; the chapter's spec with
its defaults is ``nopelib.book.chapters.TRAINED``. Nothing here trains: the live runs come from
``nopelib.training.launch.train_many``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from nopelib.averaging.theory import embedding_ratio, predict_layer1_score
from nopelib.core.metrics import layer_scores
from nopelib.core.model import GPTConfig
from nopelib.core.params import SEED, Choice, Device, ListOf
from nopelib.core.stats import seed_interval, summarize
from nopelib.core.tasks import TASKS, encode_inputs, make_split, majority_baseline, sample_inputs
from nopelib.rules import claims
from nopelib.averaging.block1 import measure_value_scale
from nopelib.core.one_model import random_model
from nopelib.training.profiles import PROFILES
from nopelib.training.train_profile import TrainProfile

# The rules of the trained chapter's parameters (its spec: ``nopelib.book.chapters``). Upper
# bounds: rough costs on the 2-core development machine, far above the defaults; the reason is
# in each message.
CHAPTER_PARAMS = {
    "profile": Choice(PROFILES),
    "tasks": ListOf(Choice(TASKS), unique=True),
    "live_tasks": ListOf(Choice(TASKS), unique=True).where(
        lambda ts, p: set(ts) <= set(p["tasks"]), "tasks read from the study"),
    "live_seeds": ListOf(SEED, unique=True, max_len=20,
                         why="each seed retrains one run per live task, up to ~35 min on one "
                             "core for the study profile"),
    "heatmap_task": Choice(TASKS).where(lambda t, p: t in p["live_tasks"], "one of live_tasks"),
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


def score_table(before: Mapping[str, np.ndarray], after: Mapping[str, np.ndarray],
                phase: Mapping[str, np.ndarray], layers: Sequence[int]) -> pd.DataFrame:
    """Mean over seeds of the scores at initialisation, after training and over the learned
    phase: one row per layer, columns (task, "before" / "after" / "learned phase")."""
    return pd.DataFrame(
        {(task, when): summarize(s)[0] for task in before
         for when, s in (("before", before[task]), ("after", after[task]),
                         ("learned phase", phase[task]))},
        index=pd.Index(layers, name="layer"))


def majority_shares(prof: TrainProfile, tasks: Sequence[str],
                    seeds: Sequence[int]) -> dict[str, float]:
    """Each task's majority-answer share (what a model that ignores its input reaches), the
    mean over the test splits of ``seeds``: the baseline a learning curve is read against."""
    return {task: float(np.mean([majority_baseline(make_split(
        task, s, n_train=prof.n_train, n_test=prof.n_test).test)[1] for s in seeds]))
        for task in tasks}


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


# ---------------------------------------------------------------------------------------------
# the committed trained-model study (nopelib.studies.trained_study)


def reproduction(live: Mapping[str, object], committed: Sequence[Mapping],
                 alpha: float = claims.ALPHA) -> pd.DataFrame:
    """A live run (``runs.TrainedRun``'s metrics) against the committed study's runs of its
    task: its exact match and every layer's score after training beside the study's mean and
    the t prediction interval of one more seed (n - 1 degrees of freedom, Bonferroni over the
    layers), and whether it lies inside."""
    if len(committed) < 2:
        raise ValueError(f"reproduction: the committed study holds {len(committed)} run(s) "
                         "of this task; an interval for one more seed needs 2 or more (a "
                         "study still training: wait for its seeds)")
    studied = np.array([r["scores_after"] for r in committed])  # [seeds, L+1]
    live_scores = live["curve"]["scores"][-1]
    level = 1 - alpha / studied.shape[1]
    rows = []
    for layer, value in enumerate(live_scores):
        mean, _, half = seed_interval(studied[:, layer], level)
        rows.append(dict(quantity=f"layer {layer} score", live=value, study_mean=mean,
                         lo=mean - half, hi=mean + half, inside=mean - half <= value <= mean + half))
    return pd.DataFrame(rows)


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


def kernel_check(doc: Mapping) -> tuple[str, pd.DataFrame]:
    """A committed kernel check (``nopelib.studies.kernels --record``): a Markdown caption (where it
    ran, its kernel sets, and whether the live runs' verdict and their reproduction check agree
    across the sets) and one row per live run and kernel set."""
    p = doc["provenance"]
    table = pd.DataFrame([dict(set=r["set"], kernels=r["capability"], task=r["task"],
                               seed=r["seed"], accuracy=r["accuracy"], steps=r["steps"],
                               train_s=r["train_seconds"], learned=r["learned"],
                               inside=r["inside"],
                               outside=", ".join(r["outside"]) or "none",
                               scores_after=" ".join(f"{x:.3f}" for x in r["scores_after"]))
                          for r in doc["runs"]])
    by_run = table.groupby(["task", "seed"])
    learned_same = bool((by_run.learned.nunique() == 1).all())
    inside_same = bool((by_run.inside.nunique() == 1).all())
    same, differs = "the same under every set", "**differs between the sets**"
    sets = "; ".join(f"{name}: {', '.join(f'{k}={v}' for k, v in env.items()) or 'native'}"
                     for name, env in p["sets"].items())
    caption = (f"Kernel check (committed): `{p['command']}` at commit `{p['commit'][:12]}` "
               f"on {p['machine']} ({p['date']}); kernel sets {sets}. Whether each live run "
               f"learned: {same if learned_same else differs}; whether it lies inside the "
               f"study's interval: {same if inside_same else differs}.")
    return caption, table


# ---------------------------------------------------------------------------------------------
# the paper's grid (committed summaries)

# the command that produces each grid's summary, from the repository root
GRID_COMMANDS = {
    "paper-base": "python -m nopelib.studies.grid paper-base --device cuda --batched "
                  "--out book/results/grid_paper-base.json",
    "paper": "python -m nopelib.studies.grid paper --address auto "
             "--out book/results/grid_paper.json",
}


def grid_caption(name: str, provenance: Mapping, n_runs: int) -> str:
    """Markdown: a committed grid summary's size and provenance."""
    return (f"Grid `{name}` (committed): {n_runs} runs, trained by "
            f"`{provenance['command']}` at commit `{provenance['commit'][:12]}` on "
            f"{provenance['machine']} (torch {provenance['torch']}, backend "
            f"{provenance['backend']}, {provenance['wall_seconds'] / 60:.1f} min wall, "
            f"{provenance['date']}).")


