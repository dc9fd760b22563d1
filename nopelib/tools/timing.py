"""Timing a call as the benchmark does: warm-up, repeats, the median, and ratios.

A device is synchronised around every timed call (CUDA runs asynchronously), the samples are
summarised by their median and spread, and a fast path is reported as its ratio against the
reference measured in the same run.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def sync_device(device: torch.device) -> None:
    """Wait for ``device``'s queued work (CUDA runs asynchronously; the CPU does not)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def sample_summary(samples: list[float]) -> dict:
    """Median and range of per-call seconds."""
    return {"median_s": statistics.median(samples), "min_s": min(samples), "max_s": max(samples),
            "repeats": len(samples)}


def time_call(
    fn: Callable[[], object], repeats: int, device: torch.device, min_sample_s: float = 0.02
) -> dict:
    """Median seconds per call of ``fn`` after one untimed warm-up call.

    Calls faster than ``min_sample_s`` are looped inside each sample (as ``timeit`` does), so
    microsecond calls are not dominated by the timer's resolution."""
    sync_device(device)
    start = time.perf_counter()
    fn()
    sync_device(device)
    inner = max(1, min(1000, int(min_sample_s / max(time.perf_counter() - start, 1e-9))))
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        sync_device(device)
        samples.append((time.perf_counter() - start) / inner)
    return sample_summary(samples)


def speed_ratio(reference_s: float, fast_s: float) -> float:
    """Speed-up of ``fast`` over ``reference``: > 1 means faster."""
    return reference_s / fast_s
