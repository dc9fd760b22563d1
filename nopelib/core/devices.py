"""Where and in which number format a run computes: the device, and bf16 autocast where it pays.

``resolve_device`` turns ``"auto"`` into CUDA, then Apple MPS, then the CPU. ``dtype_policy``
says how a training step computes on a device type under a profile's precision, and
``autocast_for`` is that policy as a context manager; both are part of what a run key records
(``nopelib.training.runs``).
"""

from __future__ import annotations

import warnings
from contextlib import AbstractContextManager, nullcontext

import torch

DEVICES = ("auto", "cpu", "cuda", "mps")


def resolve_device(device: str = "auto") -> torch.device:
    """``"auto"``: CUDA if available, then Apple MPS, then the CPU; or a named device that exists."""
    kind = device.split(":")[0] if isinstance(device, str) else None
    if kind not in DEVICES or (kind == "auto" and device != "auto"):
        raise ValueError(f"device={device!r} is unknown; allowed: {DEVICES} (or 'cuda:N')")
    mps = getattr(torch.backends, "mps", None)
    mps_ok = mps is not None and mps.is_available()
    if kind == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "mps" if mps_ok else "cpu")
    if (kind == "cuda" and not torch.cuda.is_available()) or (kind == "mps" and not mps_ok):
        raise ValueError(f"device={device!r} is not available on this machine")
    return torch.device(device)


def bf16_available() -> bool:
    """Whether this CPU has bf16 units (AVX-512 BF16 or AMX) that oneDNN computes bf16 on;
    without them bf16 autocast is emulated and slower than float32."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def dtype_policy(device_type: str, precision: str = "float32") -> str:
    """How ``train`` computes a step on a device type under a profile's ``precision``:
    bfloat16 autocast when the profile asks for it, on CUDA or on a CPU with bf16 units
    (``bf16_available``), else float32. A GPU follows the profile as a CPU does, because
    bf16 is adopted per task only where a committed check found it changes no verdict
    (``trained_files.task_profile``): a task it changes trains in float32 on every device."""
    if precision == "bfloat16" and (device_type == "cuda"
                                    or (device_type == "cpu" and bf16_available())):
        return "autocast-bfloat16"
    return "float32"


def autocast_for(device: torch.device, precision: str = "float32") -> AbstractContextManager:
    """The training step's autocast under ``dtype_policy``; float32 is no autocast. A profile
    that asks for bfloat16 on a CPU without bf16 units trains in float32, with a warning (its
    run key records float32, so it is another run than a bf16 one)."""
    policy = dtype_policy(device.type, precision)
    if precision == "bfloat16" and device.type == "cpu" and policy == "float32":
        warnings.warn("precision='bfloat16': this CPU has no bf16 units, so the run trains in "
                      "float32 (keyed as float32); expect about twice the bf16 step time",
                      stacklevel=2)
    if policy == "autocast-bfloat16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return nullcontext()
