"""The trained study's file grows by seed and never shrinks: a committed run is kept over a new
run of its seed unless ``--replace`` names the seed, and a kept run whose run key differs from
the one this invocation would train (other training sources, device or precision) is refused
before any training, since its new run would be trained and then dropped. A tiny profile, trained in
seconds."""

from __future__ import annotations

from dataclasses import replace

import pytest

import nopelib.studies.trained_study as ts
from nopelib.results import files as results
from nopelib.training import profiles
from nopelib.training.runs import run_key
from conftest import TINY_STUDY


TINY = replace(TINY_STUDY, name="tiny-replace")


@pytest.fixture
def study(tmp_path, monkeypatch):
    """The command's arguments for a folder holding the tiny study of seeds 0 and 1."""
    monkeypatch.setenv("NOPELIB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setitem(profiles.PROFILES, TINY.name, TINY)
    out = tmp_path / "out"
    out.mkdir()
    argv = ["--profile", TINY.name, "--tasks", "ordering", "--device", "cpu", "--workers", "1",
            "--out-dir", str(out), "--probe-fit-tokens", "100"]
    ts.main(argv)
    return argv, out / f"trained_{TINY.name}_ordering.json"


def _edit(path, seed: int, **fields: object) -> dict:
    """Rewrite the committed run of ``seed`` with ``fields`` changed; the edited run."""
    doc = results.load(path)
    run = next(r for r in doc["runs"] if r["seed"] == seed)
    run.update(fields)
    results.write(path, doc, "trained")
    return run


def test_a_committed_run_is_kept_unless_replace_names_its_seed(study):
    argv, path = study
    committed = _edit(path, 1, wall_seconds=10**6)  # what this invocation's run does not have
    ts.main([*argv, "--cached-only"])
    assert next(r for r in results.load(path)["runs"] if r["seed"] == 1) == committed
    ts.main([*argv, "--cached-only", "--replace", "1"])
    runs = results.load(path)["runs"]
    assert [r["seed"] for r in runs] == [0, 1]
    assert runs[1]["wall_seconds"] < 10**6 and runs[1]["key"] == committed["key"]


def test_a_kept_run_under_another_key_is_refused_before_training(study, monkeypatch, capsys):
    argv, path = study
    other = _edit(path, 0, key="0" * 32)

    def no_training(*args: object, **kwargs: object) -> None:
        raise AssertionError("the study started")

    with monkeypatch.context() as patch:
        patch.setattr(ts, "run_study", no_training)
        with pytest.raises(SystemExit) as exit_:
            ts.main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"{path} holds seed(s) [0] trained under another run key" in err
    assert "pass --replace 0 to replace them" in err
    assert results.load(path)["runs"][0] == other  # untouched
    ts.main([*argv, "--replace", "0"])  # from the run cache: the run of today's key
    runs = results.load(path)["runs"]
    assert [r["seed"] for r in runs] == [0, 1] and runs[0]["key"] != other["key"]


def test_a_task_trained_in_float32_under_a_bf16_profile_is_its_own_key(tmp_path, monkeypatch):
    # no check cleared ordering for this profile: its runs train and are keyed in float32,
    # and a rerun finds its committed runs under that key, not the profile's own
    asks_bf16 = replace(TINY, name="tiny-replace-bf16", precision="bfloat16")
    monkeypatch.setenv("NOPELIB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setitem(profiles.PROFILES, asks_bf16.name, asks_bf16)
    argv = ["--profile", asks_bf16.name, "--tasks", "ordering", "--device", "cpu",
            "--workers", "1", "--out-dir", str(tmp_path), "--probe-fit-tokens", "100"]
    ts.main(argv)
    path = tmp_path / f"trained_{asks_bf16.name}_ordering.json"
    float32 = replace(asks_bf16, precision="float32")
    runs = results.load(path)["runs"]
    assert [r["key"] for r in runs] == [run_key("ordering", s, float32, "cpu") for s in (0, 1)]
    ts.main([*argv, "--cached-only"])  # no refusal: the kept runs are today's keys
    assert results.load(path)["runs"] == runs
