"""Training runs as Ray tasks: the ``ray`` backend of ``launch.train_missing``.

Ray (https://docs.ray.io) schedules the runs: on a Ray instance started for the call (as many
CPUs as ``workers``, default all cores), or on an existing cluster named by ``address`` or by
$NOPELIB_RAY_ADDRESS (``ray.init(address=...)``; "auto" finds the cluster this machine is part
of). Each run is one task that asks for one CPU, or on GPUs a fraction of one, so several small
runs share a device (``default_gpu_fraction``).

Results come home: a worker trains through the same ``runs.train_and_score`` as a local run and
returns the weights (safetensors bytes) and metrics (JSON text); the driver commits them to its
own run cache through ``runs.commit_run``, the same atomic path as a local run. A worker never
writes to the cache, so a worker that dies mid-run leaves nothing behind; Ray reruns the task
(``max_retries``). The worker checks that it computes the driver's cache key (same nopelib
sources, torch version and device type) before training, so a cluster with other code cannot
file its runs under this code's key. On a cluster the driver's ``nopelib`` sources are shipped
to the workers (Ray's ``py_modules``); torch and the rest must be installed there.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_model, save_model
from tqdm import tqdm

import nopelib
from nopelib.core.cost import model_params
from nopelib.core.model import GPT, GPTConfig
from nopelib.training.runs import (Job, commit_run, find_missing, prepare_runs_dir, run_key,
                                   run_write_bytes, train_and_score)
from nopelib.training.train_profile import TrainProfile

ADDRESS_ENV = "NOPELIB_RAY_ADDRESS"
RAY_DEVICES = ("auto", "cpu", "cuda")


def default_gpu_fraction(config: GPTConfig) -> float:
    """The share of one GPU a run of ``config`` asks for: a quarter up to 20 M parameters (the
    paper's base model is 10.6 M and launch-bound alone), a half up to 60 M, else a whole GPU."""
    n_params = model_params(config)
    return 0.25 if n_params <= 20e6 else 0.5 if n_params <= 60e6 else 1.0


def _check_gpu_fraction(gpu_fraction: float | None) -> None:
    if gpu_fraction is None:
        return
    if (isinstance(gpu_fraction, bool) or not isinstance(gpu_fraction, (int, float))
            or not 0 < gpu_fraction <= 1):
        raise ValueError(f"gpu_fraction={gpu_fraction!r} must be a number in (0, 1]")


def start_local(num_cpus: int, tries: int = 3, **kwargs: object) -> None:
    """Start a Ray instance on this machine with ``num_cpus`` CPUs and no dashboard.

    On a loaded machine Ray's node can fail to start: its raylet gives the dashboard agent a
    fixed 15 s to come up (ray-project/ray issue 65983); such a start is retried."""
    import ray

    for attempt in range(tries):
        try:
            ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, **kwargs)
            return
        except Exception as exc:  # noqa: BLE001  (Ray raises a bare Exception here)
            ray.shutdown()
            if "timed out during startup" not in str(exc) or attempt + 1 == tries:
                raise


def connect(address: str | None, workers: int | None) -> bool:
    """Start or join Ray (a running one is used as it is); True when this call started or
    joined it, and so must shut it down."""
    import ray

    if ray.is_initialized():
        return False
    address = address or os.environ.get(ADDRESS_ENV) or None
    if address is None and not os.environ.get("RAY_ADDRESS"):
        start_local(workers or os.cpu_count() or 1)
        return True
    # another machine's workers do not see this package: ship its sources with the tasks
    ray.init(address=address, log_to_driver=False,
             runtime_env={"py_modules": [str(Path(nopelib.__file__).parent)]})
    return True


def _device_kind(device: str) -> str:
    kind = device.split(":")[0] if isinstance(device, str) else None
    if kind not in RAY_DEVICES or (kind == "auto" and device != "auto"):
        raise ValueError(f"device={device!r} is not one the ray backend schedules; allowed: "
                         f"{RAY_DEVICES} (Ray assigns the GPU itself)")
    return kind


def cluster_device(device: str) -> str:
    """The device type the runs train on: ``"auto"`` is CUDA when the cluster has a GPU."""
    import ray

    kind = _device_kind(device)
    gpus = ray.cluster_resources().get("GPU", 0)
    if kind == "auto":
        return "cuda" if gpus else "cpu"
    if kind == "cuda" and not gpus:
        raise ValueError(f"device={device!r}: the Ray cluster has no GPU")
    return kind


def _train_remote(task: str, seed: int, profile: TrainProfile, device: str,
                  key: str) -> tuple[bytes, str]:
    """The body of one Ray task: train and score one run; weights and metrics come back."""
    dev = torch.device(device)  # on a GPU worker Ray has set CUDA_VISIBLE_DEVICES to its share
    here = run_key(task, seed, profile, dev)
    if here != key:
        raise RuntimeError(f"the worker computes cache key {here} for {task!r} seed {seed}, the "
                           f"driver {key}: its nopelib sources, torch version "
                           f"({torch.__version__}) or device differ")
    model, metrics = train_and_score(task, seed, profile, dev, key, progress=False)
    metrics["worker"] = f"{os.uname().nodename} pid {os.getpid()}"
    with tempfile.TemporaryDirectory() as tmp:
        save_model(model, f"{tmp}/model.safetensors")  # handles the tied embedding
        weights = Path(f"{tmp}/model.safetensors").read_bytes()
    return weights, json.dumps(metrics)


def _receive(weights: bytes, metrics_json: str, profile: TrainProfile) -> tuple[GPT, dict]:
    model = GPT(profile.model)
    with tempfile.TemporaryDirectory() as tmp:
        Path(f"{tmp}/model.safetensors").write_bytes(weights)
        load_model(model, f"{tmp}/model.safetensors", device="cpu")
    return model.eval(), json.loads(metrics_json)


def train_missing_ray(
    jobs: list[tuple[str, int, TrainProfile]],
    device: str,
    root: Path,
    address: str | None = None,
    gpu_fraction: float | None = None,
    workers: int | None = None,
    max_retries: int = 3,
) -> list[Job]:
    """``launch.train_missing`` on Ray (see the module's docstring); the jobs are checked
    there. Ray is started (or joined) only when something trains, or when ``device="auto"``
    must ask the cluster which device it has. Finished runs are committed as they arrive, so
    an interrupted call keeps them; on a failed task the others are cancelled and the error is
    raised. Returns every job, keyed for the device the cluster trains on."""
    import ray

    _check_gpu_fraction(gpu_fraction)
    if type(max_retries) is not int or max_retries < 0:
        raise ValueError(f"max_retries={max_retries!r} must be a non-negative integer")

    def keyed(kind: str) -> tuple[list[Job], list[Job]]:
        return find_missing([Job(t, s, p, run_key(t, s, p, kind)) for t, s, p in jobs], root)

    kind = _device_kind(device)
    marked, missing = keyed(kind) if kind != "auto" else ([], [])
    if missing or kind == "auto":
        started = connect(address, workers)
        try:
            marked, missing = keyed(cluster_device(device))
            if missing:
                # the driver commits: its cache must take the runs
                prepare_runs_dir(root, run_write_bytes([job.profile for job in missing]))
                _train_on_ray(missing, cluster_device(device), root, gpu_fraction,
                              max_retries)
        finally:
            if started:
                ray.shutdown()
    return marked


def _train_on_ray(missing: list[Job], kind: str, root: Path, gpu_fraction: float | None,
                  max_retries: int) -> None:
    """Submit one task per missing run (the costliest first, as locally); commit each result
    as it arrives."""
    import ray

    remote = ray.remote(_train_remote)
    pending = {}
    for job in missing:
        gpus = (gpu_fraction or default_gpu_fraction(job.profile.model)) if kind == "cuda" else 0
        ref = remote.options(num_cpus=1, num_gpus=gpus, max_retries=max_retries).remote(
            job.task, job.seed, job.profile, kind, job.key)
        pending[ref] = job
    try:
        with tqdm(total=len(pending), desc=f"training {len(pending)} runs on Ray") as bar:
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                job = pending.pop(done[0])
                model, metrics = _receive(*ray.get(done[0]), job.profile)
                commit_run(root, job.key, model, metrics, job.profile)
                bar.update(1)
    except BaseException:
        for ref in pending:
            ray.cancel(ref, force=True)
        raise
