"""Command-line arguments are checked before any work: a bad flag exits with code 2 in well
under a second, naming the flag, the value and what is allowed (``nopelib.core.params.check_args``),
for every command that trains or measures for long: counts and their repeats, devices,
profiles, output paths, joint costs, and CPU training over an hour without
``NOPELIB_ALLOW_SLOW=1``. Nothing here trains: each command's work is replaced by a stub that
fails the test if a refusal let it start.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from nopelib.core import params
from nopelib.core.cost import ALLOW_SLOW_ENV
from nopelib.studies import grid, long_context, precision, recipe, trained_study
from nopelib.tools import bench, bench_report
from nopelib.studies import kernels


class Started(Exception):
    """The command got past its checks and started its work."""


@pytest.fixture(autouse=True)
def no_work(monkeypatch, tmp_path):
    def start(*args: object, **kwargs: object) -> None:
        raise Started

    for module, name in ((grid, "run_grid"), (recipe, "run_study"),
                         (trained_study, "run_study"), (bench, "run"), (kernels, "run_set"),
                         (long_context, "study"), (precision, "train_many")):
        monkeypatch.setattr(module, name, start)
    # the precision check runs only on a CPU with bf16 units: its arguments are checked anyway
    monkeypatch.setattr(precision, "bf16_available", lambda: True)
    monkeypatch.delenv(ALLOW_SLOW_ENV, raising=False)
    monkeypatch.delenv("NOPELIB_RAY_ADDRESS", raising=False)
    monkeypatch.setenv("NOPELIB_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def place(tmp_path: Path) -> Path:
    """A folder holding a file ``afile`` and a folder ``adir``."""
    (tmp_path / "afile").write_text("x")
    (tmp_path / "adir").mkdir()
    return tmp_path


MAINS: dict[str, Callable[[list[str]], object]] = {
    "grid": grid.main, "recipe": recipe.main, "trained_study": trained_study.main,
    "bench": bench.main, "kernels": kernels.main, "long_context": long_context.main,
    "precision": precision.main}
SLOW = [f"{ALLOW_SLOW_ENV}=1", "on the CPU in", " h ("]  # the opt-in, and the estimate

BAD = [  # (command, its arguments in folder d, what stderr must say)
    ("grid", lambda d: ["tiny", "--out", f"{d}/g.json", "--workers", "0"],
     ["--workers 0 is not allowed", ">= 1"]),
    ("grid", lambda d: ["tiny", "--out", f"{d}/g.json", "--workers", "100000"],
     ["--workers 100000", "<= 1024", "~0.3 GB"]),
    ("grid", lambda d: ["tiny", "--out", f"{d}/g.json", "--gpu-fraction", "0"],
     ["--gpu-fraction 0.0 is not allowed", "> 0.0 and <= 1.0"]),
    ("grid", lambda d: ["tiny", "--out", f"{d}/g.json", "--gpu-fraction", "1.5"],
     ["--gpu-fraction 1.5 is not allowed"]),
    ("grid", lambda d: ["tiny", "--out", f"{d}/g.json", "--gpu-fraction", "nan"],
     ["--gpu-fraction nan is not allowed", "finite"]),
    ("grid", lambda d: ["tiny", "--out", f"{d}/adir"],
     ["--out {d}/adir is not allowed: {d}/adir is an existing folder"]),
    ("grid", lambda d: ["tiny", "--out", f"{d}/afile/g.json"],
     ["--out {d}/afile/g.json", "{d}/afile is not a folder"]),
    ("recipe", lambda d: ["--out", f"{d}/r.json", "--scale", "0"], ["--scale 0", ">= 1"]),
    ("recipe", lambda d: ["--out", f"{d}/r.json", "--scale", "1000"],
     ["--scale 1000", "<= 25", "~3 h per run"]),
    ("recipe", lambda d: ["--out", f"{d}/r.json", "--seeds", "0", "-1"],
     ["--seeds -1 is not allowed", "32-bit seed"]),
    ("recipe", lambda d: ["--out", f"{d}/r.json", "--seeds", str(2**32)],
     [f"--seeds {2**32}", f"<= {2**32 - 1}"]),
    ("recipe", lambda d: ["--out", f"{d}/adir"], ["--out", "is an existing folder"]),
    ("trained_study", lambda d: ["--tasks", "reversal", "--seeds", "0", "0"],
     ["--seeds", "twice"]),
    ("trained_study", lambda d: ["--tasks", "reversal", "--seeds", str(2**64)],
     [f"--seeds {2**64}", "32-bit seed"]),
    ("trained_study", lambda d: ["--tasks", "reversal", "--workers", "0"],
     ["--workers 0 is not allowed", ">= 1"]),
    ("trained_study", lambda d: ["--tasks", "reversal", "--out-dir", f"{d}/afile"],
     ["--out-dir", "is not a folder"]),
    ("bench", lambda d: ["--json", f"{d}/adir"], ["--json", "is an existing folder"]),
    ("bench", lambda d: ["--json", f"{d}/afile/bench.json"], ["{d}/afile is not a folder"]),
    ("kernels", lambda d: ["--out", f"{d}/afile"],
     ["--out {d}/afile is not allowed: {d}/afile exists and is not a folder"]),
    ("kernels", lambda d: ["--out", f"{d}/afile/sets"], ["{d}/afile is not a folder"]),
    ("kernels", lambda d: ["--out", f"{d}/k", "--record", f"{d}/adir"],
     ["--record", "is an existing folder"]),
    ("kernels", lambda d: ["--out", f"{d}/k", "--record", f"{d}/notes.json"],
     ["--record=", "the name must be kernels_*.json"]),
    ("kernels", lambda d: ["--out", f"{d}/k", "--sets", "native", "native"],
     ["--sets native native is not allowed: 'native' is given twice; allowed: no repeats"]),
    # CPU training over an hour needs the opt-in, with the estimate in the message
    ("recipe", lambda d: ["--out", f"{d}/r.json", "--profile", "paper", "--device", "cpu"],
     ["--profile paper --scale 4 --device cpu", "profile='paper-x4-learned' trains 8 run(s)",
      *SLOW]),
    ("grid", lambda d: ["paper", "--out", f"{d}/g.json", "--device", "cpu"],
     ["grid paper --device cpu", "train 20 run(s) each", *SLOW]),
    ("trained_study", lambda d: ["--tasks", "reversal", "--device", "cpu", "--workers", "1",
                                 "--out-dir", f"{d}/adir"],
     ["--profile study --device cpu", "trains 5 run(s)", "longest committed training run",
      *SLOW]),
    ("trained_study", lambda d: ["--tasks", "reversal", "--profile", "paper_study", "--device",
                                 "cpu", "--workers", "1", "--out-dir", f"{d}/adir"],
     ["--profile paper_study --device cpu", *SLOW]),
    ("precision", lambda d: ["--tasks", "reversal", "--steps", "5000", "--workers", "1",
                             "--out-dir", f"{d}/adir"],
     ["--steps 5000", "trains 6 run(s)", "(its step cap)", *SLOW]),
    # counts, repeats, devices and profiles
    ("trained_study", lambda d: ["--tasks", "reversal", "--seeds", *map(str, range(1000))],
     ["--seeds 0 1 2 3", "(1000 values) is not allowed: seeds of profile 'study', "
      "[0, 1, 2, 3, 4]"]),
    ("trained_study", lambda d: ["--tasks", "reversal", "--seeds", "7"],
     ["--seeds 7 is not allowed: seeds of profile 'study'"]),
    ("trained_study", lambda d: ["--tasks", "reversal", "reversal", "--seeds", "0"],
     ["--tasks reversal reversal", "'reversal' is given twice"]),
    ("trained_study", lambda d: ["--tasks", "reversal", "--profile", "cpu"],
     ["--profile cpu is not allowed", "['paper_study', 'study']", "n_trajectory > 0"]),
    ("trained_study", lambda d: ["--tasks", "reversal", "--seeds", "0", "--replace", "1"],
     ["--replace 1 is not allowed: seeds this invocation trains, [0]"]),
    ("recipe", lambda d: ["--out", f"{d}/r.json", "--seeds", *map(str, range(21))],
     ["--seeds 0 1 2", "20 is not allowed: 21 value(s); allowed: 1 to 20 (each seed adds 2 runs"]),
    ("recipe", lambda d: ["--out", f"{d}/r.json", "--seeds", "3", "3"],
     ["--seeds 3 3 is not allowed: 3 is given twice; allowed: no repeats"]),
    ("precision", lambda d: ["--tasks", "reversal", "--steps", "10"],
     ["--steps 10 is not allowed: at least the profile's 200 warm-up steps"]),
    ("precision", lambda d: ["--tasks", "reversal", "--seeds", "0"],
     ["--seeds 0 is not allowed: 1 value(s); allowed: 2 to 20"]),
    ("precision", lambda d: ["--tasks", "reversal", "--profile", "cpu"],
     ["--profile cpu is not allowed", "a profile with a trajectory"]),
    ("recipe", lambda d: ["--out", f"{d}/r.json", "--device", "bogus"],
     ["--device bogus is not allowed: device='bogus' is unknown", "'auto', 'cpu', 'cuda'"]),
    ("grid", lambda d: ["tiny", "--out", f"{d}/g.json", "--device", "bogus"],
     ["--device bogus is not allowed: device='bogus' is unknown"]),
    ("grid", lambda d: ["tiny", "--out", f"{d}/g.json", "--address", "auto", "--device", "mps"],
     ["--device mps is not allowed: one of ['auto', 'cpu', 'cuda']"]),
    ("grid", lambda d: ["tiny", "--out", f"{d}/g.json", "--backend", "ray", "--device", "cuda:1"],
     ["--device cuda:1 is not allowed:"]),
    # a local Ray instance trains on this machine's cores
    ("grid", lambda d: ["paper", "--out", f"{d}/g.json", "--backend", "ray", "--device", "cpu"],
     ["grid paper --device cpu", *SLOW]),
    ("grid", lambda d: ["tiny", "--out", f"{d}/g.json", "--batched", "--backend", "ray"],
     ["--batched trains in this process: it cannot use --backend ray"]),
    ("trained_study", lambda d: ["--tasks", "reversal", "--device", "bogus"],
     ["--device bogus is not allowed: device='bogus' is unknown"]),
    # the long study: windows within T, counts, the joint cost, the output file
    ("long_context", lambda d: ["--out", f"{d}/long_x.json", "--windows", "5000", "--T", "64"],
     ["--windows 5000 is not allowed: each window at most --T"]),
    ("long_context", lambda d: ["--out", f"{d}/long_x.json", "--seeds", "0", "1"],
     ["--seeds 0 1 is not allowed: 2 value(s); allowed: 3 to 20"]),
    ("long_context", lambda d: ["--out", f"{d}/long_x.json", "--widths", "192", "192"],
     ["--widths 192 192 is not allowed: 192 is given twice"]),
    ("long_context", lambda d: ["--out", f"{d}/long_x.json", "--T", "16384", "--widths", "768",
                                "1536", "--seeds", *map(str, range(20))],
     ["--seeds 0 1", "--seeds x models", "= 20 x 24", "about 16 h", "at most 1 h (30 units)",
      f"{ALLOW_SLOW_ENV}=1"]),
    ("long_context", lambda d: ["--out", f"{d}/adir"],
     ["--out {d}/adir is not allowed: {d}/adir is an existing folder"]),
    ("long_context", lambda d: ["--out", f"{d}/afile/long_x.json"], ["{d}/afile is not a folder"]),
    ("long_context", lambda d: ["--out", f"{d}/x.json"], ["--out", "a long_*.json file"]),
    ("trained_study", lambda d: ["--tasks", "reversal", "--out-dir", f"{d}/afile/sub"],
     ["--out-dir {d}/afile/sub is not allowed: {d}/afile is not a folder"]),
    ("trained_study", lambda d: ["--tasks", "reversal", "--out-dir", f"{d}/missing"],
     ["--out-dir {d}/missing is not allowed: an existing folder"]),
    ("precision", lambda d: ["--tasks", "reversal", "--out-dir", f"{d}/afile"],
     ["--out-dir {d}/afile is not allowed: {d}/afile exists and is not a folder"]),
]


def _refused(command: str, argv: list[str], capsys) -> str:
    """stderr of ``command``'s main on ``argv``, which must exit with code 2 within a second."""
    start = time.perf_counter()
    with pytest.raises(SystemExit) as exit_:
        MAINS[command](argv)
    seconds = time.perf_counter() - start
    assert exit_.value.code == 2
    assert seconds < 1, f"{command} took {seconds:.2f} s to refuse {argv}"
    return capsys.readouterr().err


@pytest.mark.parametrize("command, argv, says", BAD,
                         ids=[f"{c}-{i}" for i, (c, _, _) in enumerate(BAD)])
def test_a_bad_argument_exits_2_naming_it(place, capsys, command, argv, says):
    err = _refused(command, argv(place), capsys)
    for text in says:
        assert text.format(d=place) in err, err


def test_every_bad_argument_is_named_in_one_error(place, capsys):
    err = _refused("grid", ["tiny", "--out", str(place / "adir"), "--workers", "-3",
                            "--gpu-fraction", "2"], capsys)
    assert "--out" in err and "--workers -3" in err and "--gpu-fraction 2.0" in err


def test_an_unwritable_folder_is_refused(place, capsys, monkeypatch):
    """(os.access is stubbed: the tests may run as root, who may write anywhere.)"""
    locked = place / "adir"
    real = os.access
    monkeypatch.setattr(params.os, "access",
                        lambda path, mode: Path(path) != locked and real(path, mode))
    err = _refused("recipe", ["--out", str(locked / "new" / "r.json")], capsys)
    assert f"{locked} is not writable" in err
    err = _refused("kernels", ["--out", str(locked)], capsys)
    assert f"{locked} is not writable" in err
    err = _refused("long_context", ["--out", str(locked / "long_x.json")], capsys)
    assert f"--out {locked}/long_x.json is not allowed: {locked} is not writable" in err
    err = _refused("trained_study", ["--tasks", "reversal", "--out-dir", str(locked)], capsys)
    assert f"--out-dir {locked} is not allowed: {locked} is not writable" in err


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_a_read_only_folder_is_refused(place, capsys):
    locked = place / "adir"
    locked.chmod(0o500)
    try:
        err = _refused("trained_study", ["--tasks", "reversal", "--out-dir", str(locked)],
                       capsys)
        assert f"{locked} is not writable" in err
        err = _refused("long_context", ["--out", str(locked / "long_x.json")], capsys)
        assert f"{locked} is not writable" in err
    finally:
        locked.chmod(0o700)


def test_a_study_file_that_cannot_be_read_or_written_is_refused(place, capsys):
    """A committed file that does not load would be overwritten unread after hours of training;
    a folder in its place could not be written at all."""
    (place / "adir" / "trained_study_reversal.json").write_text("{not json")
    err = _refused("trained_study", ["--tasks", "reversal", "--seeds", "0", "--device", "cpu",
                                     "--out-dir", str(place / "adir")], capsys)
    study = place / "adir" / "trained_study_reversal.json"
    assert f"--out-dir {place}/adir: {study}: cannot be read" in err
    (place / "adir" / "trained_study_ordering.json").mkdir()
    err = _refused("trained_study", ["--tasks", "ordering", "--out-dir", str(place / "adir")],
                   capsys)
    assert "a folder in which none of ['trained_study_ordering.json'] is a folder" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize("command, argv", [
    ("recipe", lambda d: ["--out", f"{d}/r.json"]),
    ("grid", lambda d: ["tiny", "--out", f"{d}/g.json"]),
    ("trained_study", lambda d: ["--tasks", "reversal"]),
])
def test_cuda_on_a_machine_without_it_is_a_usage_error(place, capsys, command, argv):
    err = _refused(command, [*argv(place), "--device", "cuda"], capsys)
    assert ("--device cuda is not allowed: device='cuda' is not available on this machine; "
            "allowed: 'auto', 'cpu'") in err


def test_the_opt_in_turns_the_refusal_into_a_warning_with_the_estimate(place, monkeypatch):
    monkeypatch.setenv(ALLOW_SLOW_ENV, "1")
    with pytest.warns(UserWarning, match=r"profile='paper-x4-learned' trains 8 run\(s\) on the "
                                         r"CPU in about \d+ h"):
        with pytest.raises(Started):
            recipe.main(["--out", str(place / "r.json"), "--profile", "paper", "--device", "cpu"])
    with pytest.warns(UserWarning, match=r"--seeds x models .* about 16 h"):
        with pytest.raises(Started):
            long_context.main(["--out", str(place / "long_x.json"), "--T", "16384", "--widths",
                               "768", "1536", "--seeds", *map(str, range(20))])


GOOD = [  # arguments that must pass the checks (the work then starts: the stub raises)
    ("grid", lambda d: ["tiny", "--out", f"{d}/new/deeper/g.csv", "--workers", "2",
                        "--gpu-fraction", "1"]),
    # a Ray cluster's devices are not this machine's: no CPU estimate
    ("grid", lambda d: ["paper", "--out", f"{d}/g.json", "--address", "auto", "--device", "cpu"]),
    ("recipe", lambda d: ["--out", f"{d}/adir/r.json", "--tasks", "reversal", "--seeds", "0",
                          str(2**32 - 1), "--scale", "4", "--device", "cpu"]),
    ("trained_study", lambda d: ["--tasks", "reversal", "--seeds", "0", "1", "--device", "cpu",
                                 "--out-dir", f"{d}/adir", "--workers", "2"]),
    # nothing trains: no estimate
    ("trained_study", lambda d: ["--tasks", "reversal", "indexing", "--device", "cpu",
                                 "--workers", "1", "--cached-only", "--out-dir", f"{d}/adir"]),
    ("bench", lambda d: ["--small", "--json", f"{d}/new/bench.json"]),
    ("kernels", lambda d: ["--out", f"{d}/adir"]),
    ("kernels", lambda d: ["--out", f"{d}/new/sets"]),
    ("kernels", lambda d: ["--out", f"{d}/k", "--record", f"{d}/adir/kernels_study.json"]),
    # the committed study's command line: ~40 min estimated
    ("long_context", lambda d: ["--out", f"{d}/new/long_context.json"]),
    ("long_context", lambda d: ["--out", f"{d}/long_x.json", "--T", "64", "--windows", "64"]),
    ("long_context", lambda d: ["--out", f"{d}/long_x.json", "--windows"]),
    ("precision", lambda d: ["--tasks", "reversal", "--seeds", "0", "1", "--steps", "250",
                             "--workers", "4", "--out-dir", f"{d}/new"]),
]


@pytest.mark.parametrize("command, argv", GOOD, ids=[f"{c}-{i}" for i, (c, _) in enumerate(GOOD)])
def test_good_arguments_pass(place, command, argv):
    with pytest.raises(Started):
        MAINS[command](argv(place))


def test_the_bench_writer_creates_missing_folders_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "a" / "b" / "bench.json"
    bench_report.write_json({"x": [1, 2]}, path)
    assert json.loads(path.read_text()) == {"x": [1, 2]}
    assert [p.name for p in path.parent.iterdir()] == ["bench.json"]
    assert [p.name for p in tmp_path.iterdir()] == ["a"]
