"""The trained chapter's campaign table (nopelib.book.trained.campaign_table): what of the
queue is committed, in flight or queued, and how far a run got where a checkpoint keeps it."""

from __future__ import annotations

from types import SimpleNamespace

from nopelib.book import trained as tb


def test_a_gpu_sittings_lost_steps_are_not_progress() -> None:
    ledger = {"provenance": {"queue": [["ordering", 0], ["ordering", 1], ["indexing", 0],
                                       ["addition", 0]]},
              "runs": [{"task": "ordering", "seed": 0, "to_step": 6140, "wall_seconds": 3600},
                       {"task": "ordering", "seed": 0, "to_step": 9000,
                        "wall_seconds": 3600, "device": "cpu"},
                       {"task": "ordering", "seed": 1, "to_step": 20000,
                        "wall_seconds": 540, "device": "cuda"}]}
    study = SimpleNamespace(docs={"addition": {"runs": [{"seed": 0}]}})
    table = tb.campaign_table(ledger, study)
    assert table.loc[("ordering", 0)].tolist() == ["in flight", "9,000", "2.0"]
    assert table.loc[("ordering", 1)].tolist() == ["in flight", "", "0.1"]
    assert table.loc[("indexing", 0)].tolist() == ["queued", "", ""]
    assert table.loc[("addition", 0), "state"] == "committed"
