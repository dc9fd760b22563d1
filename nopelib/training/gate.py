"""The time gate: CPU training expected to take over an hour is refused unless opted into.

A chapter or command that would train for hours on a CPU stops before any work with the
expected time and the ways out (a GPU, a smaller profile, or ``NOPELIB_ALLOW_SLOW=1``, which
turns the refusal into a warning). The rules themselves live in ``nopelib.core.params``; this
module sizes training jobs with the training code's own cost model (``launch``).
"""

from __future__ import annotations

import math
import os
from typing import Sequence

from nopelib.core.cost import SLOW_HOURS, hours_text, slow_refusal
from nopelib.core.devices import resolve_device
from nopelib.core.params import shown
from nopelib.training.launch import expected_cpu_seconds
from nopelib.training.profiles import get_profile
from nopelib.training.train_profile import TrainProfile

TRAINING_ALLOWED = "a GPU (device='cuda'), profile 'cpu'"  # what check_training_time suggests


def training_time_problem(profile: TrainProfile | Sequence[TrainProfile], n_runs: int,
                          device: str = "auto", run_seconds: float | None = None,
                          workers: int | None = None,
                          basis: str = "as measured", allowed: str = TRAINING_ALLOWED
                          ) -> str | None:
    """None, or the refusal of CPU training expected to take over SLOW_HOURS (after a warning
    with the expected time where $NOPELIB_ALLOW_SLOW=1). ``profile`` is a ``TrainProfile``
    (resolved by the caller), or a list of them trained one after another (a grid's
    configurations), each ``n_runs`` times on ``workers`` processes (default: one per core).
    One run takes ``run_seconds`` on one thread (a measured time, e.g. the committed study's,
    described by ``basis``), else ``launch.expected_cpu_seconds``. ``allowed`` names the ways
    out."""
    profs = list(profile) if isinstance(profile, (list, tuple)) else [profile]
    if not all(isinstance(p, TrainProfile) for p in profs):
        raise TypeError(f"profile={profile!r}: a TrainProfile or a list of them is allowed "
                        "(a name is resolved once by the caller: profiles.get_profile)")
    if resolve_device(device).type != "cpu" or n_runs < 1:
        return None
    processes = min(workers or os.cpu_count() or 1, n_runs)
    rounds = math.ceil(n_runs / processes)
    hours = sum(expected_cpu_seconds(p) if run_seconds is None else run_seconds
                for p in profs) * rounds / 3600
    if hours <= SLOW_HOURS:
        return None
    # a budget that follows progress has no cost known in advance: its step cap bounds it
    bound = " up to" if run_seconds is None and any(p.stop_at for p in profs) else ""
    who = (f"profile={profs[0].name!r} trains {n_runs} run(s)" if len(profs) == 1 else
           f"profiles {shown([p.name for p in profs])} train {n_runs} run(s) each")
    return slow_refusal(f"{who} on the CPU in{bound} about {hours_text(hours)} h ({processes} "
                        f"process(es), one thread each)"
                        + (f" {basis}" if run_seconds is not None else "")
                        + (" (its step cap)" if bound else ""), allowed)


def check_training_time(profile: str | TrainProfile, n_runs: int, device: str = "auto",
                        run_seconds: float | None = None) -> None:
    """Refuse, before any work, CPU training expected to take over SLOW_HOURS, unless
    $NOPELIB_ALLOW_SLOW=1 (then warn with the expected time): ``training_time_problem`` on one
    process per core, raised as a chapter's bad parameter. ``profile`` is the chapter's
    profile name (resolved here, once) or a ``TrainProfile``."""
    prof = get_profile(profile)
    if (why := training_time_problem(prof, n_runs, device, run_seconds)) is not None:
        raise ValueError(f"bad parameter(s):\n  {why}")
