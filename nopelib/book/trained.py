"""The trained chapter's rules, specs, plumbing and figures: a committed study read and judged.

The chapter (``book/trained.ipynb``, the paper's model first) and its page on the smaller
model (``book/trained_small.ipynb``) both read a committed trained-model study the same way:
its files, the runs' table, the accuracy per task against each task's majority answer, the
tasks learned and judged, the claims' tests and verdicts, and why a task has no verdict yet.
``read_study`` does it once for a profile, so that neither page repeats the other's code; the
campaign ledger's table says what of the paper's model is still training. Each page has its
spec (``CHAPTER``, ``SMALL``: the rules of its parameters and their defaults); the figures only
these pages draw are at the end, the renderer and the shared ones ``nopelib.book.viz``'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from nopelib.book import viz
from nopelib.book.viz import DEFAULT_COLOURS
from nopelib.core.chapter import ChapterSpec
from nopelib.core.params import SEED, Choice, Device, ListOf
from nopelib.core.tasks import TASKS
from nopelib.results import trained_files as committed, trained_prose, trained_tables
from nopelib.rules import claims as tc
from nopelib.training.profiles import PROFILES
from nopelib.training.train_profile import TrainProfile

# The rules of the chapter's parameters. Upper bounds: rough costs on the 2-core development
# machine, far above the defaults; the reason is in each message.
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

CHAPTER = ChapterSpec("trained", CHAPTER_PARAMS, dict(
    profile="study",  # the committed study's profile (nopelib.training.profiles)
    tasks=list(TASKS),  # tasks read from the study
    live_tasks=["reversal"],  # retrained live: does this machine reproduce the study?
    live_seeds=[0],  # seeds retrained live (each one run per live task)
    heatmap_task="reversal",  # live task whose model's matrices are shown per layer
    device="auto",  # "auto": CUDA, then MPS, then CPU
), claims={tc.AFTER_TRAINING: "the-paper-s-claims", tc.FIRST_KEEP: "the-paper-s-claims",
           tc.LATER_WEAKEN: "the-paper-s-claims"})

# the chapter's page on the smaller model: the committed study it reads, at the chapter's
# defaults (its rules are the chapter's)
SMALL_NAMES = ("profile", "tasks")
SMALL = ChapterSpec("trained_small", {n: CHAPTER_PARAMS[n] for n in SMALL_NAMES},
                    {n: CHAPTER.defaults[n] for n in SMALL_NAMES})


@dataclass
class TrainedStudy:
    """A profile's committed study as a chapter reads it (``read_study``)."""
    profile: str
    prof: TrainProfile
    docs: dict  # task -> its committed file
    untested: list  # tasks with no committed file
    stale: list  # tasks whose file was trained under an earlier profile
    held: dict  # task -> seeds committed
    runs: pd.DataFrame | None  # one row per (task, seed)
    baselines: dict  # task -> its majority answer's share of the test split
    acc: pd.DataFrame | None  # one row per task
    learned: list
    judged: list
    tests: pd.DataFrame | None  # every test of the claims, layer by layer
    verdicts: pd.DataFrame | None  # one row per claim, reading and task
    standing: dict  # task -> why it has no verdict ("" where it has one)

    @property
    def shown(self) -> list[str]:
        """The tasks the scores are shown for: the judged ones, else the learned ones."""
        return self.judged or self.learned

    def name(self) -> str:
        """The model in a few words: '6 x 384 (paper_study)'."""
        return f"{self.prof.model.n_layer} x {self.prof.model.n_embd} ({self.profile})"


def read_study(profile: str, tasks: Sequence[str], exploratory: bool = True) -> TrainedStudy:
    """The committed study of ``profile`` on ``tasks``, read and judged by the claims' rules
    (``trained_tables.trained_verdicts``). With ``exploratory`` a study with no judged task is
    judged on its learned tasks, marked exploratory; without it (a study still in flight)
    it has no verdicts until a task is judged."""
    prof = PROFILES[profile]
    docs, untested = committed.load_study(profile, tasks)
    stale = committed.stale_tasks(profile, tasks)
    baselines = trained_tables.majority_shares(prof, tasks, prof.seeds)
    runs = acc = tests = verdicts = None
    learned, judged = [], []
    if docs:
        runs = trained_tables.study_table(docs)
        acc = trained_tables.study_accuracy(runs, prof.n_test, baselines,
                                            n_seeds=len(prof.seeds))
        learned, judged = trained_tables.learned_and_judged(acc)
        if judged or (exploratory and learned):
            tests, verdicts = trained_tables.trained_verdicts(docs, acc)
            verdicts = verdicts.assign(paper="holds")
    standing = trained_tables.task_standing(acc, tasks, len(prof.seeds), stale)
    return TrainedStudy(profile, prof, docs, untested, stale,
                        committed.seeds_in(docs, tasks), runs, baselines, acc, learned,
                        judged, tests, verdicts, standing)


def where_each_task_is(s: TrainedStudy, tasks: Sequence[str]) -> pd.DataFrame:
    """One row per task: the seeds committed of the profile's, and where its file came from
    (or that it is stale, or not trained yet)."""
    rows = []
    for task in tasks:
        where = (trained_prose.study_provenance(s.docs[task]) if task in s.docs
                 else "stale, not read (trained under an earlier version of the profile)"
                 if task in s.stale else "not trained yet")
        rows.append({"task": task, "seeds in": f"{s.held[task]} of {len(s.prof.seeds)}",
                     "committed file": where})
    return pd.DataFrame(rows).set_index("task")


# the columns of a study's runs that fit the page, in this order
RUN_COLUMNS = ("task", "seed", "accuracy", "steps", "decay_from", "learned_from", "tail",
               "precision", "train_s")


def runs_table(s: TrainedStudy) -> pd.DataFrame:
    """The study's runs, one row each, in the columns that fit the page (``RUN_COLUMNS``
    present), rounded."""
    if s.runs is None:
        return pd.DataFrame()
    cols = [c for c in RUN_COLUMNS if c in s.runs]
    return s.runs[cols].set_index(["task", "seed"]).round(3)


def campaign_table(ledger: Mapping, s: TrainedStudy) -> pd.DataFrame:
    """The campaign's queue (its ledger ``ledger``) against the study ``s``, one row per run:
    'committed' where its task's file holds the seed, else 'in flight' with the step its
    latest CPU sitting reached, where its checkpoint stands (a GPU sitting's unfinished run
    keeps no checkpoint), or 'queued'; the steps lost to machine changes; and the sittings'
    wall hours on it, on any device. The ledger's records are in the order of their
    sittings."""
    rows = []
    for task, seed in ledger["provenance"]["queue"]:
        mine = [r for r in ledger["runs"] if r["task"] == task and r["seed"] == seed]
        done = task in s.docs and seed in {r["seed"] for r in s.docs[task]["runs"]}
        kept = [r["to_step"] for r in mine if r.get("device", "cpu") == "cpu"]
        state = "committed" if done else "in flight" if mine else "queued"
        hours = sum(r["wall_seconds"] for r in mine) / 3600
        lost = sum(r["steps_lost"] for r in mine)
        rows.append({"task": task, "seed": seed, "state": state,
                     "step reached": f"{kept[-1]:,}" if kept else "",
                     "steps lost": f"{lost:,}" if mine else "",
                     "hours so far": f"{hours:.1f}" if mine else ""})
    return pd.DataFrame(rows).set_index(["task", "seed"])


def model_dependence(a: TrainedStudy, b: TrainedStudy,
                     tasks: Sequence[str]) -> pd.DataFrame:
    """Per reading and task, whether its verdict differs between the two models
    (``trained_prose.model_dependence``), each model's column its verdict or its reason."""
    return trained_prose.model_dependence({a.name(): a.verdicts, b.name(): b.verdicts}, tasks,
                                          {a.name(): a.standing, b.name(): b.standing})


# ---------------------------------------------------------------------------------------------
# the figures only these pages draw


def before_after_lines(
    layers: Sequence[int],
    stats: dict[str, tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]],
    title: str = "",
) -> go.Figure:
    """Adjacency score per layer before and after training, one panel per task.

    ``stats[task]`` is ((mean, std) before, (mean, std) after), each [n_layer + 1].
    """

    tasks = list(stats)
    fig = make_subplots(rows=1, cols=len(tasks), subplot_titles=tasks, shared_yaxes=True)
    for col, task in enumerate(tasks, start=1):
        for (mean, std), name, colour in zip(stats[task], ("before training", "after training"),
                                             ("#888888", "#d62728")):
            fig.add_trace(go.Scatter(x=list(layers), y=np.asarray(mean), mode="lines+markers",
                                     error_y=dict(type="data", array=np.asarray(std)), name=name,
                                     line=dict(color=colour), legendgroup=name,
                                     showlegend=col == 1),
                          row=1, col=col)
    fig.add_hline(y=0.5, line_dash="dot")
    fig.update_xaxes(title_text="layer", dtick=1)
    fig.update_yaxes(range=[0.3, 1.02], title_text="adjacency score", col=1)
    fig.update_layout(height=420, title=title)
    return fig


def learning_curves(
    curves: dict[str, tuple[Sequence[int], Sequence[float]]],
    baselines: dict[str, float],
    threshold: float | None = None,
    title: str = "",
) -> go.Figure:
    """Test exact match against training step, one panel per task.

    ``curves`` maps ``"task, label"`` to (steps, accuracies); curves of one task share a panel.
    ``baselines`` gives each task's majority-answer share (dotted); ``threshold`` a dashed line.
    """

    tasks = list(dict.fromkeys(name.split(", ")[0] for name in curves))
    fig = make_subplots(rows=1, cols=len(tasks), subplot_titles=tasks, shared_yaxes=True)
    colours = {}
    for name, (steps, accuracy) in curves.items():
        task, label = name.split(", ", 1)
        colour = colours.setdefault(label, DEFAULT_COLOURS[len(colours) % len(DEFAULT_COLOURS)])
        fig.add_trace(go.Scatter(x=list(steps), y=list(accuracy), mode="lines", name=label,
                                 legendgroup=label, line=dict(color=colour),
                                 showlegend=task == tasks[0]),
                      row=1, col=tasks.index(task) + 1)
    for col, task in enumerate(tasks, start=1):
        if task in baselines:
            fig.add_hline(y=baselines[task], line_dash="dot", line_color="#555", row=1, col=col)
        if threshold is not None:
            fig.add_hline(y=threshold, line_dash="dash", line_color="#2ca02c", row=1, col=col)
    fig.update_xaxes(title_text="step")
    fig.update_yaxes(range=[-0.02, 1.02], title_text="test exact match", col=1)
    fig.update_layout(title=title, height=400)
    return fig


def run_curves(runs: dict, baselines: dict[str, float], threshold: float | None = None,
               title: str = "") -> go.Figure:
    """``learning_curves`` of trained runs (``runs`` maps (task, seed) to a
    ``runs.TrainedRun``, whose metrics hold its curve), one line per seed."""
    curves = {f"{task}, seed {seed}": (run.metrics["curve"]["step"],
                                       run.metrics["curve"]["accuracy"])
              for (task, seed), run in runs.items()}
    return learning_curves(curves, baselines, threshold=threshold, title=title)


def recipe_curves(studies: dict[str, dict], baselines: dict[str, float],
                  threshold: float | None = None, title: str = "") -> go.Figure:
    """``learning_curves`` of every run of the committed recipe studies
    (``results.load_all("recipe")``), one line per position encoding and seed."""
    names = {"none": "NoPE", "learned": "learned position"}
    curves = {f"{r['task']}, {names[r['pos_encoding']]}, seed {r['seed']}":
              (r["curve"]["step"], r["curve"]["accuracy"])
              for recipe in studies.values() for r in recipe["runs"]}
    return learning_curves(curves, baselines, threshold=threshold, title=title)


def grid_adjacency(runs: pd.DataFrame, title: str = "") -> go.Figure:
    """A trained grid's adjacency score per layer (mean over seeds), one panel per task, one
    colour per configuration: after training solid, before training dotted.

    ``runs`` is a grid summary's runs (``nopelib.studies.grid.load_summary``): columns task,
    n_layer, n_embd, adjacency_before and adjacency_after (lists, one score per layer).
    """

    tasks = list(dict.fromkeys(runs["task"]))
    configs = sorted({(int(n), int(d)) for n, d in zip(runs["n_layer"], runs["n_embd"])})
    fig = make_subplots(rows=1, cols=len(tasks), subplot_titles=tasks, shared_yaxes=True)
    for col, task in enumerate(tasks, start=1):
        for i, (n_layer, n_embd) in enumerate(configs):
            sel = runs[(runs["task"] == task) & (runs["n_layer"] == n_layer)
                       & (runs["n_embd"] == n_embd)]
            name, colour = f"{n_layer} x {n_embd}", DEFAULT_COLOURS[i % len(DEFAULT_COLOURS)]
            for column, dash, shown in (("adjacency_after", "solid", True),
                                        ("adjacency_before", "dot", False)):
                if sel.empty:
                    continue
                mean = np.mean(np.stack(sel[column].tolist()), axis=0)  # [n_layer + 1]
                fig.add_trace(go.Scatter(x=list(range(n_layer + 1)), y=mean, mode="lines",
                                         name=name, legendgroup=name,
                                         line=dict(color=colour, dash=dash),
                                         showlegend=shown and col == 1),
                              row=1, col=col)
    fig.add_hline(y=0.5, line_dash="dot")
    fig.update_xaxes(title_text="layer")
    fig.update_yaxes(range=[0.3, 1.02], title_text="adjacency score", col=1)
    fig.update_layout(height=420, title=title or "adjacency score per layer: after training "
                      "(solid), before (dotted)")
    return fig


def figure1_menu(docs: Mapping[str, Mapping], model: str) -> go.Figure:
    """The paper's Figure 1 from committed runs, one figure whatever the number of tasks: a
    menu picks the task (``docs`` maps a task to its committed file), whose first committed
    seed's self-similarity matrices show layer by layer, each panel on its own colour scale
    (its range in its title), the positions as ticks ('index:character')."""
    grids = {}
    for task, doc in docs.items():
        run = doc["runs"][0]
        text, mats = run["matrices"]["text"], np.asarray(run["matrices"]["layers"])
        grids[task] = dict(matrices=list(mats),  # [L+1, T, T]
                           titles=[f"layer {layer}" for layer in range(len(mats))],
                           labels=[f"{i}:{c}" for i, c in enumerate(text)], cols=4,
                           per_panel=True,
                           title=f"{model}, {task}, seed {run['seed']}: {text}")
    return viz.heatmap_grid_menu(grids)
