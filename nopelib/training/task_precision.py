"""The precision each task of a profile trains in: bf16 autocast only where it is declared here.

A profile that asks for bf16 autocast (``TrainProfile.precision``) trains a task in it only
once a precision check of that profile found "no change" on the task
(``nopelib.studies.precision``, committed as ``book/results/precision_<profile>_*.json``; the
rule is ``nopelib.rules.bf16``); every other task trains in float32. ``BF16_TASKS`` declares
those tasks per profile, so a run's profile is known from the code alone, not read from the
committed files when it trains; ``tests/studies/test_trained_study.py`` derives the same sets from
the committed checks (``trained_files.bf16_cleared``) and fails when the two disagree. (The
profiles themselves cannot hold it: ``profiles.py`` is a training source, and any change to
its code changes every run key.)
"""

from __future__ import annotations

from dataclasses import replace

from nopelib.training.train_profile import BATCHED_SUFFIX, TrainProfile

# per profile that asks for bf16 autocast, the tasks a committed precision check cleared
BF16_TASKS: dict[str, frozenset[str]] = {"paper_study": frozenset({"reversal"})}


def task_profile(profile: TrainProfile, task: str) -> TrainProfile:
    """The profile ``task``'s runs train under: ``profile``, in float32 where it asks for bf16
    autocast and ``BF16_TASKS`` does not clear the task: the trained and the early study train
    a task alike. A run's key holds the profile it ran."""
    base = profile.name.removesuffix(BATCHED_SUFFIX)
    if profile.precision == "bfloat16" and task not in BF16_TASKS.get(base, frozenset()):
        return replace(profile, precision="float32")
    return profile
