"""A committed study is replaced only on purpose (``nopelib.results.guard``): every
command that writes into ``book/results`` refuses, before any training, a file name of another
result kind, a file of another kind, profile or configuration, and a write that would drop
committed runs, unless ``--replace`` names what goes; a profile change never drops a trained
study's runs silently; and two writers of one study file merge their runs. The commands' work
is replaced by a stub that fails a test if a refusal let it start; the tiny studies train in
seconds."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

import nopelib.studies.trained_study as ts
from nopelib.core.cost import ALLOW_SLOW_ENV
from nopelib.core.model import GPTConfig
from nopelib.store import cache
from nopelib.results import files as results, guard, trained_files
from nopelib.studies import early_study, grid, long_context, precision, recipe, text_study
from nopelib.studies import kernels
from nopelib.training import profiles
from conftest import TINY_STUDY


COMMITTED = results.RESULTS_DIR
# the time gate's estimate for the committed studies' profiles: what is tested is the refusal
pytestmark = pytest.mark.filterwarnings("ignore:profile=.* on the CPU in about")


class Started(Exception):
    """The command got past its checks and started its work."""


def _start(*args: object, **kwargs: object) -> None:
    raise Started


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv(ALLOW_SLOW_ENV, "1")  # the time gate is not what is tested here


def _refused(main, argv: list[str], capsys) -> str:
    """The one-line error of a refused command (exit code 2), nothing started."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    return capsys.readouterr().err


def _copy(name: str, folder: Path) -> Path:
    """A copy of the committed result ``name`` in ``folder``."""
    return Path(shutil.copy(COMMITTED / name, folder / name))


def test_a_name_of_another_kind_is_refused_even_with_replace(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(grid, "run_grid", _start)
    monkeypatch.setattr(recipe, "run_study", _start)
    out = tmp_path / "trained_study_reversal.json"
    for argv in ([], ["--replace"]):
        err = _refused(grid.main, ["tiny", "--out", str(out), *argv], capsys)
        assert f"--out {out}: the name is a trained result's" in err
        assert "this command writes a grid result (grid tiny; backend local)" in err
    out = tmp_path / "trained_study_ordering.json"
    err = _refused(recipe.main, ["--out", str(out), "--tasks", "ordering", "--device", "cpu"],
                   capsys)
    assert f"--out {out}: the name is a trained result's" in err and "recipe_*.json" in err
    assert not out.exists()


def test_a_long_study_of_other_widths_is_replaced_only_with_replace(tmp_path, monkeypatch,
                                                                    capsys):
    monkeypatch.setattr(long_context, "study", _start)
    out = _copy("long_context.json", tmp_path)
    before = out.read_bytes()
    argv = ["--out", str(out), "--T", "256", "--widths", "192", "--seeds", "0", "1", "2"]
    err = _refused(long_context.main, argv, capsys)
    assert f"--out {out}: it holds a long result (T 8192; n_embd 192, 384, 768" in err
    assert "would write a long result (T 256; n_embd 192; window 64; seed 0, 1, 2)" in err
    assert "pass --replace to replace it" in err and out.read_bytes() == before
    with pytest.raises(Started):
        long_context.main([*argv, "--replace"])


def test_a_committed_precision_check_is_replaced_only_with_replace(tmp_path, monkeypatch,
                                                                   capsys):
    monkeypatch.setattr(precision, "train_many", _start)
    monkeypatch.setattr(precision, "bf16_available", lambda: True)
    out = _copy("precision_paper_study_reversal.json", tmp_path)
    argv = ["--tasks", "reversal", "--seeds", "0", "1", "--steps", "250",
            "--out-dir", str(tmp_path)]
    err = _refused(precision.main, argv, capsys)
    assert f"--out-dir {out}: it holds a precision result (profile paper_study" in err
    assert "pass --replace to replace it, or another --out-dir" in err
    with pytest.raises(Started):
        precision.main([*argv, "--replace"])


def test_a_committed_kernel_check_is_replaced_only_with_replace(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(kernels, "run_set", _start)
    out = _copy("kernels_study.json", tmp_path)
    argv = ["--out", str(tmp_path / "sets"), "--record", str(out)]
    err = _refused(kernels.main, argv, capsys)
    assert f"--record {out}: it holds a kernels result (profile study" in err
    with pytest.raises(Started):
        kernels.main([*argv, "--replace"])


def test_a_text_study_of_another_profile_or_fewer_seeds_is_refused(tmp_path, monkeypatch,
                                                                   capsys):
    monkeypatch.setattr(text_study, "run_study", _start)
    out = _copy("text_text.json", tmp_path)
    err = _refused(text_study.main, ["--profile", "text_tiny", "--out", str(out)], capsys)
    assert f"{out} holds a text result (profile text; encoding learned, none; seed 0, 1, 2" in err
    assert "trained under another record of the profile" in err and "name 'text' -> " in err
    assert "pass --replace 0 1 2 to replace them" in err
    # the same profile, one seed: the other seeds' runs would go
    err = _refused(text_study.main, ["--seeds", "0", "--out", str(out)], capsys)
    assert "dropping the committed runs of seed(s) [1, 2]" in err
    assert "this command does not compute them again" in err
    for argv in (["--profile", "text_tiny", "--replace", "0", "1", "2"],
                 ["--seeds", "0", "--replace", "1", "2"]):
        with pytest.raises(Started):
            text_study.main([*argv, "--out", str(out)])


def test_an_early_study_of_another_profile_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(early_study, "run_study", _start)
    out = _copy("early_study.json", tmp_path)
    argv = ["--profile", "paper_study", "--tasks", "reversal", "--ablations", "none",
            "--out", str(out)]
    err = _refused(early_study.main, argv, capsys)
    assert f"{out} holds an early result (profile study; task addition, indexing" in err
    assert "name 'study_early' -> 'paper_study_early'" in err
    assert "pass --replace 0 1 2 to replace them, or another --out" in err
    with pytest.raises(Started):
        early_study.main([*argv, "--replace", "0", "1", "2"])


# a trained study in seconds
TINY = replace(TINY_STUDY, name="tiny-guard")


@pytest.fixture
def study(tmp_path, monkeypatch):
    """The command's arguments for a folder holding the tiny study of seeds 0 and 1, read as
    the committed results."""
    monkeypatch.setitem(profiles.PROFILES, TINY.name, TINY)
    monkeypatch.setattr(results, "RESULTS_DIR", tmp_path)
    argv = ["--profile", TINY.name, "--tasks", "ordering", "--device", "cpu", "--workers", "1",
            "--out-dir", str(tmp_path), "--probe-fit-tokens", "100"]
    ts.main(argv)
    return argv, tmp_path / f"trained_{TINY.name}_ordering.json"


def test_a_profile_change_never_drops_runs_silently(study, monkeypatch, capsys):
    argv, path = study
    before = path.read_bytes()
    monkeypatch.setitem(profiles.PROFILES, TINY.name, replace(TINY, log_every=10))
    # the chapters read the file as stale: no verdict on runs of another record
    assert trained_files.load_study(TINY.name, ["ordering"]) == ({}, ["ordering"])
    assert trained_files.stale_tasks(TINY.name, ["ordering"]) == ["ordering"]
    with monkeypatch.context() as patch:
        patch.setattr(ts, "run_study", _start)
        for seeds in (["--seeds", "0"], ["--cached-only"]):
            err = _refused(ts.main, [*argv, *seeds], capsys)
            assert f"{path} holds a trained result (profile {TINY.name}" in err
            assert "seed 0, 1; 2 runs" in err and "log_every 5 -> 10" in err
            assert "dropping the committed runs of seed(s) [0, 1]" in err
            assert "pass --replace 0 1 to replace them, or move the file aside" in err
        assert path.read_bytes() == before
        # --replace naming one seed is not enough: the other would go too
        err = _refused(ts.main, [*argv, "--seeds", "0", "--replace", "0"], capsys)
        assert "seed(s) [0, 1]" in err
    ts.main([*argv, "--replace", "0", "1"])
    doc = results.load(path)
    assert [r["seed"] for r in doc["runs"]] == [0, 1] and doc["provenance"]["runs_kept"] == 0
    assert trained_files.is_current(doc, TINY.name)


def test_two_trained_study_writers_merge_their_runs(study, monkeypatch):
    argv, path = study
    doc = results.load(path)
    seed0 = {"provenance": {**doc["provenance"], "seeds": [0]}, "runs": doc["runs"][:1]}
    path.unlink()  # this writer reads no file when it starts
    real = ts.run_study

    def meanwhile(*args: object, **kwargs: object) -> tuple:
        results.write(path, seed0, "trained")  # another invocation writes seed 0
        return real(*args, **kwargs)

    monkeypatch.setattr(ts, "run_study", meanwhile)
    ts.main([*argv, "--seeds", "1", "--cached-only"])
    after = results.load(path)
    assert [r["seed"] for r in after["runs"]] == [0, 1]
    assert after["runs"][0] == seed0["runs"][0] and after["provenance"]["runs_kept"] == 1
    assert after["provenance"]["seeds"] == [0, 1]


def test_two_early_study_writers_merge_their_runs(tmp_path, monkeypatch):
    tiny = replace(profiles.PROFILES["study"], model=GPTConfig(n_layer=2, n_head=2, n_embd=16),
                   warmup_steps=5, n_train=96, n_test=200, n_eval=200, n_curve=200, n_val=40,
                   log_every=5)
    monkeypatch.setitem(profiles.PROFILES, "study", tiny)
    monkeypatch.setitem(early_study.WINDOWS, "study", (20, 10))
    out = tmp_path / "early_tiny.json"
    argv = ["--tasks", "addition", "--ablations", "none", "--out", str(out)]
    early_study.main([*argv, "--seeds", "0"])
    first = results.load(out)
    out.unlink()  # this writer reads no file when it starts
    real = early_study.run_study

    def meanwhile(*args: object, **kwargs: object) -> list[dict]:
        results.write(out, first, "early")  # another invocation writes seed 0
        return real(*args, **kwargs)

    monkeypatch.setattr(early_study, "run_study", meanwhile)
    early_study.main([*argv, "--seeds", "1"])
    after = results.load(out)
    assert [r["seed"] for r in after["runs"]] == [0, 1]
    assert after["runs"][0] == first["runs"][0] and after["provenance"]["seeds"] == [0, 1]
    assert after["provenance"]["kept_from"][0]["date"] == first["provenance"]["date"]


def test_a_single_result_written_while_the_command_ran_is_not_replaced(tmp_path, monkeypatch,
                                                                        capsys):
    out = tmp_path / "long_x.json"
    committed_doc = json.loads((COMMITTED / "long_context.json").read_text())

    def meanwhile(*args: object, **kwargs: object) -> list[dict]:
        out.write_text(json.dumps(committed_doc))  # another invocation's file
        return committed_doc["runs"]

    monkeypatch.setattr(long_context, "study", meanwhile)
    with pytest.raises(guard.Refused, match="written while this command ran"):
        long_context.main(["--out", str(out), "--T", "64", "--widths", "192", "--seeds", "0",
                           "1", "2"])
    assert json.loads(out.read_text()) == committed_doc


def test_a_result_file_s_writers_take_turns_under_its_lock(tmp_path):
    path = tmp_path / "recipe_x.json"

    def try_lock() -> None:
        other = os.open(tmp_path, os.O_RDONLY)  # another writer's
        try:
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(other)

    with results.locked(path):
        with pytest.raises(BlockingIOError):
            try_lock()
    try_lock()  # free once the writer is done
    assert list(tmp_path.iterdir()) == []  # no lock file left behind
