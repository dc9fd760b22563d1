"""Which committed runs an early-dynamics study file keeps when a study writes it.

An early study (``nopelib.studies.early_study``) grows by the runs it adds: a run it computes
replaces the committed one, and every other committed run stays. ``kept_runs`` says which, on
the file as it stands when the command starts (before any training) and again as it stands when
the command writes (re-read under the file's lock by ``results.write``: another invocation may
have added runs since), and refuses what one file cannot hold: runs of another profile record
not named by ``--replace`` (``guard``), of other CPU kernels, or of another precision
within a task.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch

from nopelib.core.devices import dtype_policy
from nopelib.results import files as results, guard
from nopelib.results.kinds import run_policy
from nopelib.training.profiles import get_profile
from nopelib.training.task_precision import task_profile

Job = tuple[str, int, str, tuple[str, ...]]  # task, seed, study profile, parts held


def kept_runs(path: Path, old: dict | None, training: dict, todo: Sequence[Job],
              replace: Sequence[int]) -> tuple[list[dict], list]:
    """The runs of ``old``, the committed document of the file at ``path`` (None: no file),
    that a write of this invocation keeps: those of the same study profile (``training``, its
    record) whose (task, seed, frozen parts) ``todo`` does not compute, and the invocations
    they came from (the file's ``kept_from``, then its own command, commit and date). A file
    of another profile record keeps none, and is refused (``guard.Refused``) unless
    ``replace`` names every seed it holds: one file holds one record, and no run is dropped
    silently. A file trained under other CPU kernels (its ``cpu_capability``) raises
    ResultsError: one file holds one kernel set. So does a kept run of a task ``todo``
    computes that trained in another precision than this CPU trains that task in
    (``run_policy``): one task, one precision."""
    if old is None:
        return [], []
    prov, training = old["provenance"], json.loads(json.dumps(training))  # tuples as in a file
    would = f"runs of the {todo[0][2]} profile's record of today" if todo else "other runs"
    guard.refuse(guard.stale_problem(path, old, would, training, replace))
    if prov["training"] != training:  # every seed named by replace
        return [], []
    here = torch.backends.cpu.get_cpu_capability()
    if prov.get("cpu_capability", here) != here:  # one file, one kernel set
        raise results.ResultsError(
            f"{path}: its runs trained under the {prov['cpu_capability']} kernels and this "
            f"process runs {here}; a study under another kernel set is written to its own "
            "file (--out)")
    mine = {(task, seed, tuple(frozen)) for task, seed, _, frozen in todo}
    kept = [r for r in old["runs"] if (r["task"], r["seed"], tuple(r["frozen"])) not in mine]
    now = {task: dtype_policy("cpu", task_profile(get_profile(profile), task).precision)
           for task, _, profile, _ in todo}
    other = sorted({r["task"] for r in kept
                    if r["task"] in now and run_policy(r, training) != now[r["task"]]})
    if other:
        raise results.ResultsError(
            f"{path}: its runs of {other} trained in another precision than this CPU trains "
            f"them in ({', '.join(f'{t} {now[t]}' for t in other)}) or record none; a task's "
            "runs share one precision: run every seed and ablation of these tasks again")
    if not kept:
        return [], []
    return kept, [*prov.get("kept_from", []), {k: prov[k] for k in ("command", "commit", "date")}]
