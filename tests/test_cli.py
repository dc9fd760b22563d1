"""Command-line arguments are checked before any work: a bad flag exits with code 2 in well
under a second, naming the flag, the value and what is allowed (``nopelib.params.check_args``),
for every command that trains or measures for long. Nothing here trains: each command's work
is replaced by a stub that fails the test if a refusal let it start.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from nopelib import bench, bench_report, grid, kernels, params, recipe, trained_study


class Started(Exception):
    """The command got past its checks and started its work."""


@pytest.fixture(autouse=True)
def no_work(monkeypatch):
    def start(*args: object, **kwargs: object) -> None:
        raise Started

    for module, name in ((grid, "run_grid"), (recipe, "run_study"),
                         (trained_study, "run_study"), (bench, "run"), (kernels, "run_set")):
        monkeypatch.setattr(module, name, start)


@pytest.fixture
def place(tmp_path: Path) -> Path:
    """A folder holding a file ``afile`` and a folder ``adir``."""
    (tmp_path / "afile").write_text("x")
    (tmp_path / "adir").mkdir()
    return tmp_path


MAINS: dict[str, Callable[[list[str]], object]] = {
    "grid": grid.main, "recipe": recipe.main, "trained_study": trained_study.main, "bench": bench.main,
    "kernels": kernels.main}

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


GOOD = [  # arguments that must pass the checks (the work then starts: the stub raises)
    ("grid", lambda d: ["tiny", "--out", f"{d}/new/deeper/g.csv", "--workers", "2",
                        "--gpu-fraction", "1"]),
    ("recipe", lambda d: ["--out", f"{d}/adir/r.json", "--seeds", "0", str(2**32 - 1),
                          "--scale", "4"]),
    ("trained_study", lambda d: ["--tasks", "reversal", "ordering", "--seeds", "0", "1",
                                 "--out-dir", f"{d}/adir", "--workers", "2"]),
    ("bench", lambda d: ["--small", "--json", f"{d}/new/bench.json"]),
    ("kernels", lambda d: ["--out", f"{d}/adir"]),
    ("kernels", lambda d: ["--out", f"{d}/new/sets"]),
    ("kernels", lambda d: ["--out", f"{d}/k", "--record", f"{d}/adir/kernels_study.json"]),
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
