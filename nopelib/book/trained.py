"""The trained chapter's plumbing: a model's committed study read, judged and placed.

The chapter (``book/trained.ipynb``, the paper's model first) and its page on the smaller
model (``book/trained_small.ipynb``) both read a committed trained-model study the same way:
its files, the runs' table, the accuracy per task against each task's majority answer, the
tasks learned and judged, the claims' tests and verdicts, and why a task has no verdict yet.
``read_study`` does it once for a profile, so that neither page repeats the other's code; the
campaign ledger's table says what of the paper's model is still training.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pandas as pd

from nopelib.results import trained_files as committed, trained_prose, trained_tables
from nopelib.training.profiles import PROFILES
from nopelib.training.train_profile import TrainProfile


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
    'committed' where its task's file holds the seed, else 'in flight' with the furthest step
    a CPU sitting reached (a GPU sitting's unfinished run keeps no checkpoint: its steps are
    lost), or 'queued'; and the sittings' wall hours on it, on any device."""
    rows = []
    for task, seed in ledger["provenance"]["queue"]:
        mine = [r for r in ledger["runs"] if r["task"] == task and r["seed"] == seed]
        done = task in s.docs and seed in {r["seed"] for r in s.docs[task]["runs"]}
        kept = [r["to_step"] for r in mine if r.get("device", "cpu") == "cpu"]
        step = max(kept, default=None)
        state = "committed" if done else "in flight" if mine else "queued"
        hours = sum(r["wall_seconds"] for r in mine) / 3600
        rows.append({"task": task, "seed": seed, "state": state,
                     "step reached": "" if step is None else f"{step:,}",
                     "hours so far": f"{hours:.1f}" if mine else ""})
    return pd.DataFrame(rows).set_index(["task", "seed"])


def model_dependence(a: TrainedStudy, b: TrainedStudy,
                     tasks: Sequence[str]) -> pd.DataFrame:
    """Per reading and task, whether its verdict differs between the two models
    (``trained_prose.model_dependence``), each model's column its verdict or its reason."""
    return trained_prose.model_dependence({a.name(): a.verdicts, b.name(): b.verdicts}, tasks,
                                          {a.name(): a.standing, b.name(): b.standing})
