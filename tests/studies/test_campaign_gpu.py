"""Tests of the campaign on a GPU, on the CPU: the cuda path of ``run_campaign`` with stand-in
runs (device "cuda" keys and records; the processes are small scripts), the refusals of
``--device`` and ``--streams``, the prepared device command's shell plumbing with a stand-in
campaign, the merge of what it returns, and the import closure a GPU machine must hold."""

import ast
import os
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from nopelib.results import files as results
from nopelib.studies import campaign, campaign_gpu

ROOT = Path(__file__).resolve().parents[2]
# a stand-in run: checkpoints every 0.2 s until ``quiet_after`` steps (then it runs on without
# one, as a GPU run between checkpoints does); with a step target it finishes there
FAKE_RUN = """
import sys, time
from pathlib import Path
folder, finish_at, done, quiet_after = (Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]),
                                        int(sys.argv[4]))
folder.mkdir(parents=True, exist_ok=True)
step = max([int(p.name) for p in folder.iterdir()], default=0)
while True:
    time.sleep(0.2)
    step += 10
    if step <= quiet_after:
        (folder / f"{step:09d}").mkdir()
    if finish_at and step >= finish_at:
        done.write_text("finished")
        break
"""
QUEUE = [("ordering", 0), ("indexing", 0), ("ordering", 1), ("addition", 0), ("indexing", 1)]


@pytest.fixture
def gpu_sitting(monkeypatch, tmp_path):
    """A sitting of stand-in runs on the cuda path: ``finish`` maps a run to the step it
    finishes at; every launch is noted in ``launched``."""
    cache, out = tmp_path / "cache", tmp_path / "results"
    out.mkdir()
    monkeypatch.setenv("NOPELIB_CACHE_DIR", str(cache))
    # a CPU sitting would wait for the next checkpoint (or a minute past it) at the deadline
    monkeypatch.setattr(campaign, "CHECKPOINT_SECONDS", 60)
    monkeypatch.setattr(campaign, "GRACE_SECONDS", 60)
    monkeypatch.setattr(campaign, "pending", lambda folder: [
        run for run in QUEUE if not (tmp_path / f"done_{run[0]}_{run[1]}").exists()])
    monkeypatch.setattr(campaign, "committed_steps", lambda folder, task, seed: 999)
    launched: list[tuple[str, int]] = []

    def run(seconds: float, finish: dict, streams: int = 3, device: str = "cuda",
            min_start: float | None = 0, quiet_after: int = 10**6) -> list[dict]:
        def launch(task, seed, out_dir, logs):
            launched.append((task, seed))
            folder = cache / "checkpoints" / campaign.key_of(task, seed, device)
            done = tmp_path / f"done_{task}_{seed}"
            return subprocess.Popen([sys.executable, "-c", FAKE_RUN, str(folder),
                                     str(finish.get((task, seed), 0)), str(done),
                                     str(quiet_after)], start_new_session=True)
        until = datetime.now(timezone.utc) + timedelta(seconds=seconds)
        return campaign.run_campaign(until, out, streams, launch, poll=0.05, argv=["--x"],
                                     device=device, min_start=min_start)
    return run, cache, out, launched


def test_the_next_task_s_missing_seeds_come_first_together():
    assert campaign.by_task(QUEUE) == [("ordering", 0), ("ordering", 1), ("indexing", 0),
                                       ("indexing", 1), ("addition", 0)]
    assert campaign.by_task([]) == []
    assert campaign.key_of("ordering", 0, "cuda") != campaign.key_of("ordering", 0)


def test_a_cuda_sitting_stops_its_runs_at_the_deadline_and_records_their_steps_lost(
        gpu_sitting):
    run, cache, out, launched = gpu_sitting
    started = time.monotonic()
    # the runs go quiet after step 30: a CPU sitting would wait for a checkpoint that never
    # comes, up to CHECKPOINT_SECONDS + GRACE_SECONDS past the deadline
    records = run(1.5, {}, quiet_after=30)
    assert time.monotonic() - started < 1.5 + 5.0
    assert launched == [("ordering", 0), ("ordering", 1), ("indexing", 0)]
    for record in records:
        assert record["device"] == "cuda" and record["streams"] == 3
        assert record["key"] == campaign.key_of(record["task"], record["seed"], "cuda")
        assert not record["finished"] and record["from_step"] == 0
        assert record["to_step"] == 30 and record["steps_lost"] == 30
    ledger = results.load(out / campaign.LEDGER)  # loads, and says the same
    assert [r["steps_lost"] for r in ledger["runs"]] == [30, 30, 30]
    assert results.check_all(out) == [campaign.LEDGER]
    # a later sitting (a fresh machine: no checkpoints) does not count those steps again,
    # and the CPU campaign's notice of runs left in flight elsewhere ignores GPU records
    for folder in (cache / "checkpoints").iterdir():
        for step in folder.iterdir():
            step.rmdir()
    again = run(1.0, {}, quiet_after=20)
    assert [(r["from_step"], r["to_step"], r["steps_lost"]) for r in again] == [(0, 20, 20)] * 3
    assert campaign.reached_before(ledger["runs"], records[0]["key"]) == 0
    assert campaign.elsewhere(ledger["runs"], QUEUE) == []


def test_finished_runs_make_way_for_the_next_task_s_seeds(gpu_sitting):
    run, cache, out, launched = gpu_sitting
    finish = {("ordering", 0): 20, ("ordering", 1): 20, ("indexing", 0): 20}
    records = run(4.0, finish, streams=2)
    assert launched[:2] == [("ordering", 0), ("ordering", 1)]
    assert launched[2:4] == [("indexing", 0), ("indexing", 1)]
    done = {(r["task"], r["seed"]): r for r in records}
    assert all(done[run]["finished"] and done[run]["steps_lost"] == 0 for run in finish)
    assert not done["indexing", 1]["finished"] and done["indexing", 1]["steps_lost"] > 0
    assert results.load(out / campaign.LEDGER)["runs"][0]["finished"]


def test_a_cpu_sitting_keeps_the_queue_s_order(gpu_sitting):
    run, cache, out, launched = gpu_sitting
    records = run(30.0, {run_: 10 for run_ in QUEUE}, streams=2, device="cpu")
    assert launched == QUEUE and all(r["finished"] for r in records)
    assert {r["device"] for r in records} == {"cpu"} and "gpu" not in records[0]
    assert records[0]["key"] == campaign.key_of("ordering", 0)


def test_no_run_starts_with_less_than_the_margin_left(gpu_sitting, monkeypatch):
    run, cache, out, launched = gpu_sitting
    assert run(60.0, {}, min_start=120) == [] and launched == []
    monkeypatch.setattr(campaign, "CUDA_MIN_START_SECONDS", 120)
    monkeypatch.setattr(campaign, "MIN_START_SECONDS", 0)
    assert run(60.0, {}, min_start=None) == [] and launched == []  # cuda's default margin
    monkeypatch.setattr(campaign, "CUDA_MIN_START_SECONDS", 30)
    everything = {run_: 10 for run_ in QUEUE}
    assert len(run(60.0, everything, min_start=None)) == len(QUEUE)


def test_a_cuda_run_is_launched_with_the_device_its_threads_and_checkpoints(monkeypatch,
                                                                            tmp_path):
    seen = {}

    def popen(command, env, **kwargs):
        seen.update(command=command, env=env)
        return "process"
    monkeypatch.setattr(campaign.subprocess, "Popen", popen)
    assert campaign.launch_run("ordering", 3, tmp_path, tmp_path, "cuda", 4) == "process"
    command = seen["command"]
    assert command[command.index("--device") + 1] == "cuda"
    assert command[command.index("--seeds") + 1] == "3" and "--backend" not in command
    assert seen["env"]["OMP_NUM_THREADS"] == "4"
    assert seen["env"]["NOPELIB_CHECKPOINT_SECONDS"] == str(campaign.CUDA_CHECKPOINT_SECONDS)
    campaign.launch_run("ordering", 3, tmp_path, tmp_path)
    assert seen["command"][seen["command"].index("--device") + 1] == "cpu"
    assert seen["env"]["OMP_NUM_THREADS"] == "1"
    assert seen["env"]["NOPELIB_CHECKPOINT_SECONDS"] == str(campaign.CHECKPOINT_SECONDS)


def test_streams_above_two_only_on_cuda_and_the_refusals_name_the_flag(monkeypatch, tmp_path,
                                                                       capsys):
    refused = ((["--streams", "3"], "--streams=3"), (["--streams", "0"], "--streams=0"),
               (["--device", "cuda"], "--device='cuda'"),  # this machine has no CUDA
               (["--min-start", "soon"], "--min-start='soon'"))
    for extra, words in refused:
        with pytest.raises(SystemExit) as exit_:
            campaign.main(["--until", "9m", "--out-dir", str(tmp_path), *extra])
        assert exit_.value.code == 2 and words in capsys.readouterr().err
    monkeypatch.setattr(campaign.torch.cuda, "is_available", lambda: True)
    with pytest.raises(SystemExit) as exit_:
        campaign.main(["--until", "9m", "--device", "cuda", "--streams", "9"])
    assert exit_.value.code == 2 and "--streams=9" in capsys.readouterr().err
    campaign.main(["--until", "9m", "--device", "cuda", "--streams", "8", "--dry-run",
                   "--out-dir", str(tmp_path)])
    assert "14 of 14 queued runs" in capsys.readouterr().out


def test_the_ledger_allows_more_than_two_streams_on_cuda_only(gpu_sitting):
    run, cache, out, launched = gpu_sitting
    run(0.5, {}, streams=5)
    path = out / campaign.LEDGER
    doc = results.load(path)
    assert doc["runs"][0]["streams"] == 5
    for device, streams, words in (("cpu", 3, "streams"), (None, 3, "streams"),
                                   ("cuda", 9, "streams"), ("gpu", 1, "device")):
        record = {**doc["runs"][0], "streams": streams, "device": device}
        if device is None:
            del record["device"]
        with pytest.raises(results.ResultsError, match=words):
            results.validate({**doc, "runs": [record]}, "campaign", str(path))
    # the committed ledger (CPU sittings, no device field) still loads
    assert results.load(results.RESULTS_DIR / campaign.LEDGER)["runs"]


def test_the_prepared_command_fits_the_device_tool_and_returns_the_changed_files(tmp_path):
    command = campaign_gpu.COMMAND
    assert len(command) <= campaign_gpu.MAX_COMMAND and "\n" not in command
    for words in ("--device cuda", "--until 9m", "--out-dir book/results", "PYTHONUNBUFFERED=1",
                  "NOPELIB_CACHE_DIR=/tmp/"):
        assert words in command
    assert command in (ROOT / "book" / "appendix_performance.md").read_text()
    # its tiny version: a stand-in campaign that changes one study file, the ledger and the
    # manifest, and writes a run's log, in a checkout with one file it leaves alone
    checkout, out, cache = tmp_path / "checkout", tmp_path / "out", tmp_path / "cache"
    (checkout / "book" / "results").mkdir(parents=True)
    out.mkdir()
    untouched = checkout / "book" / "results" / "trained_paper_study_reversal.json"
    untouched.write_text("{}")
    os.utime(untouched, (time.time() - 60, time.time() - 60))
    stand_in = (f"{sys.executable} -c \"from pathlib import Path; r = Path('book/results'); "
                "[(r / n).write_text('{}') for n in ('trained_paper_study_ordering.json', "
                f"'campaign_paper_study.json', 'MANIFEST.json')]; l = Path('{cache}') / "
                "'campaign_logs'; l.mkdir(parents=True); (l / 'ordering_0.log').write_text('x'); "
                "print('stand-in campaign')\"")
    shell = command.replace(campaign_gpu.CAMPAIGN, stand_in).replace(campaign_gpu.CACHE,
                                                                     str(cache))
    assert shell != command and campaign_gpu.CAMPAIGN in command
    subprocess.run(["bash", "-c", shell], cwd=checkout, env={**os.environ, "OUT": str(out)},
                   check=True, capture_output=True, timeout=60)
    assert sorted(p.name for p in out.iterdir()) == [
        "MANIFEST.json", "campaign.log", "campaign_paper_study.json", "logs.tar.gz",
        "trained_paper_study_ordering.json"]
    assert "stand-in campaign" in (out / "campaign.log").read_text()
    sizes = [p.stat().st_size for p in results.RESULTS_DIR.glob("trained_paper_study_*.json")]
    assert sizes and max(sizes) < 4 * 2**20  # five runs of a task: well under 16 MiB


def _study_file(folder: Path, seeds: list[int]) -> Path:
    """A paper-study file of ``folder`` holding the committed reversal runs of ``seeds``,
    written and signed by ``results.write``."""
    committed = results.load(results.RESULTS_DIR / "trained_paper_study_reversal.json")
    origin = {"how": "run cache", "finished": committed["provenance"]["date"]}
    runs = [{**r, "origin": origin} for r in committed["runs"] if r["seed"] in seeds]
    doc = {"provenance": {**committed["provenance"], "seeds": seeds}, "runs": runs}
    path = folder / "trained_paper_study_reversal.json"
    results.write(path, doc, "trained")
    return path


def test_merge_back_adds_the_gpu_runs_and_records_and_keeps_what_landed_meanwhile(
        gpu_sitting, tmp_path, capsys):
    run, cache, out, launched = gpu_sitting
    gpu, here = out, tmp_path / "here"  # what the GPU sitting returned, and this checkout
    here.mkdir()
    run(0.5, {})  # the GPU sitting's ledger
    _study_file(gpu, [0, 1])  # it trained seed 1
    _study_file(here, [0, 2])  # the CPU campaign finished seed 2 meanwhile
    campaign_gpu.main(["--merge-from", str(gpu), "--out-dir", str(here)])
    assert "merged" in capsys.readouterr().out
    merged = results.load(here / "trained_paper_study_reversal.json")
    assert [r["seed"] for r in merged["runs"]] == [0, 1, 2]
    ledger = results.load(here / campaign.LEDGER)
    assert {r["device"] for r in ledger["runs"]} == {"cuda"} and len(ledger["runs"]) == 3
    before = {p.name: p.read_bytes() for p in here.iterdir()}
    campaign_gpu.main(["--merge-from", str(gpu), "--out-dir", str(here)])  # again: no change
    assert {p.name: p.read_bytes() for p in here.iterdir()} == before
    # a returned file edited after its sitting wrote it is refused, nothing merged from it
    edited = gpu / "trained_paper_study_reversal.json"
    edited.write_text(edited.read_text().replace('"accuracy": 0.9998', '"accuracy": 0.5', 1))
    for argv, words in ((["--merge-from", str(gpu), "--out-dir", str(here)], "MANIFEST"),
                        (["--merge-from", str(tmp_path / "none")], "--merge-from="),
                        (["--merge-from", str(gpu), "--out-dir", str(gpu)], "--out-dir=")):
        with pytest.raises(SystemExit) as exit_:
            campaign_gpu.main(argv)
        assert exit_.value.code == 2 and words in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in here.iterdir()} == before


# what a GPU machine's python3 holds besides the standard library (numba with it)
GPU_PACKAGES = {"torch", "numpy", "pandas", "safetensors", "scipy", "yaml", "tqdm", "numba"}


def _module_imports(module: str) -> tuple[set[str], set[str]]:
    """The nopelib modules and the other top-level packages ``module`` imports at module
    level (its statements outside functions and classes)."""
    path = ROOT / (module.replace(".", "/") + ".py")
    if not path.is_file():
        path = ROOT / module.replace(".", "/") / "__init__.py"
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    ours, theirs = set(), set()
    todo = list(ast.parse(path.read_text()).body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]
                                + ([node.module] if node.module else []))
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            todo += [c for c in ast.iter_child_nodes(node) if isinstance(c, ast.stmt)]
            continue
        for name in names:
            top = name.split(".")[0]
            if top == "nopelib":
                parts = name.split(".")
                ours |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
            elif top not in sys.stdlib_module_names and top != "__future__":
                theirs.add(top)
    return ours, theirs


def test_the_gpu_command_imports_nothing_a_gpu_machine_lacks():
    seen, packages, todo = set(), set(), ["nopelib.studies.campaign", "nopelib.studies.campaign_gpu",
                                          "nopelib.studies.trained_study"]
    while todo:
        module = todo.pop()
        exists = (ROOT / (module.replace(".", "/") + ".py")).is_file() or (
            ROOT / module.replace(".", "/") / "__init__.py").is_file()
        if module in seen or not exists:
            continue  # a name imported from a module, not a module
        seen.add(module)
        ours, theirs = _module_imports(module)
        todo += sorted(ours)
        packages |= theirs
    assert "nopelib.core.metrics" in seen and "nopelib.training.train" in seen
    assert "numba" in packages and "torch" in packages
    assert packages <= GPU_PACKAGES, packages - GPU_PACKAGES
