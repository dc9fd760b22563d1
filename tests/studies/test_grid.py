"""Tests of the grid command (issue 16, nopelib.studies.grid): the tiny grid trains, resumes from
the cache, and writes a summary (JSON or CSV) whose scores are recomputable and whose provenance is
complete; bad names are refused."""

from __future__ import annotations

import json
import time

import numpy as np
import pandas as pd
import pytest

from nopelib.book import trained
from nopelib.core import metrics, tasks
from nopelib.results import files as results
from nopelib.studies import grid
from nopelib.core import one_model
from nopelib.training import profiles


pytestmark = pytest.mark.usefixtures("one_thread_cache")


def test_the_named_grids():
    paper = grid.GRIDS["paper"]
    assert paper.n_runs == 4 * 5 * 9 == 180
    sizes = {(p.model.n_layer, p.model.n_embd) for p in paper.profiles}
    assert sizes == {(n, d) for n in (6, 12, 24) for d in (192, 384, 768)}
    assert profiles.PROFILES["paper"] in paper.profiles  # the base model's runs are the chapters'
    assert len({p.name for p in paper.profiles}) == 9
    assert grid.GRIDS["paper-base"].n_runs == 20


def test_tiny_grid_writes_a_summary_and_resumes(tmp_path, capsys):
    out = tmp_path / "tiny.json"
    grid.main(["tiny", "--out", str(out), "--workers", "1"])
    provenance, runs = grid.load_summary(out)
    tiny = grid.GRIDS["tiny"]
    assert len(runs) == tiny.n_runs == 8
    assert provenance["trained"] == 8 and provenance["backend"] == "local"
    for field in ("command", "commit", "machine", "torch", "wall_seconds", "date", "devices"):
        assert provenance[field] not in (None, "")
    assert set(runs["task"]) == set(tiny.tasks) and set(runs["seed"]) == set(tiny.seeds)
    assert runs["accuracy"].between(0, 1).all()
    for _, row in runs.iterrows():
        assert len(row["adjacency_before"]) == len(row["adjacency_after"]) == row["n_layer"] + 1
    # a row's "before" scores are those of the seed's initial model, recomputed here
    row = runs.iloc[-1]
    prof = next(p for p in tiny.profiles if p.name == row["profile"])
    texts = tasks.sample_inputs(row["task"], tiny.n_inputs, seed=0)
    before = metrics.layer_scores(one_model.random_model(prof.model, int(row["seed"])), texts)
    assert np.allclose(row["adjacency_before"], before.mean(axis=0), atol=1e-6)
    assert row["adjacency_before"] != row["adjacency_after"]  # training changed the model
    # again: every run comes from the cache, the same numbers
    grid.main(["tiny", "--out", str(tmp_path / "tiny.csv"), "--workers", "1"])
    provenance2, runs2 = grid.load_summary(tmp_path / "tiny.csv")
    assert provenance2["trained"] == 0 and runs2["from_cache"].all()
    assert runs2["accuracy"].tolist() == runs["accuracy"].tolist()
    assert runs2["adjacency_after"].tolist() == runs["adjacency_after"].tolist()
    assert "wrote" in capsys.readouterr().out


def test_summary_table(tmp_path):
    rows = grid.run_grid(grid.Grid("t", ("addition",), (0, 1), (grid.TINY,), n_inputs=8),
                         workers=1)
    table = grid.summary_table(grid.load_summary(_write(tmp_path, rows))[1])
    assert table.shape[0] == 1 and table["seeds"].iloc[0] == 2
    mean = np.mean([r["adjacency_after"][1] for r in rows])
    assert table["first_after mean"].iloc[0] == pytest.approx(mean, abs=1e-3)
    fig = trained.grid_adjacency(pd.DataFrame(rows))
    assert len(fig.data) == 2  # one configuration, after and before
    assert list(fig.data[0].y) == pytest.approx(np.mean([r["adjacency_after"] for r in rows], 0))


def _write(tmp_path, rows):
    path = tmp_path / "s.json"
    provenance = results.provenance("test", [], time.perf_counter(), grid="t", backend="local")
    grid.write_summary(path, provenance, rows)
    assert json.loads(path.read_text())["provenance"] == provenance
    return path


@pytest.mark.parametrize("kwargs, match", [
    (dict(grid="nope"), "grid='nope' is unknown"),
    (dict(grid="tiny", backend="mpi"), "backend='mpi' is unknown"),
    (dict(grid="tiny", backend="ray", batched=True), "batched=True .* backend='ray'"),
])
def test_bad_grid_arguments_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        grid.run_grid(**kwargs)


def test_the_gpu_command_runs_on_the_cpu_with_the_tiny_grid(tmp_path):
    """The README's GPU run (``--batched``, the paper-base grid) is the same command as this,
    on the tiny grid and the CPU: the batched backend, its own keys, a validated summary."""
    out = tmp_path / "grid_tiny.json"
    grid.main(["tiny", "--device", "cpu", "--batched", "--out", str(out)])
    provenance, runs = grid.load_summary(out)
    assert provenance["batched"] and provenance["backend"] == "batched"
    assert set(runs["profile"]) == {"tiny+batched", "tiny-L3+batched"}
    assert runs["accuracy"].between(0, 1).all()
