"""The trained chapter's campaign table (nopelib.book.trained.campaign_table): what of the
queue is committed, in flight or queued, and how far a run got where a checkpoint keeps it."""

from __future__ import annotations

from types import SimpleNamespace

from nopelib.book import trained as tb


def test_a_gpu_sittings_lost_steps_are_not_progress() -> None:
    ledger = {"provenance": {"queue": [["ordering", 0], ["ordering", 1], ["indexing", 0],
                                       ["addition", 0]]},
              "runs": [{"task": "ordering", "seed": 0, "to_step": 6140, "wall_seconds": 3600,
                        "steps_lost": 0},
                       {"task": "ordering", "seed": 0, "to_step": 9000,
                        "wall_seconds": 3600, "device": "cpu", "steps_lost": 0},
                       {"task": "ordering", "seed": 1, "to_step": 20000,
                        "wall_seconds": 540, "device": "cuda", "steps_lost": 0}]}
    study = SimpleNamespace(docs={"addition": {"runs": [{"seed": 0}]}})
    table = tb.campaign_table(ledger, study)
    assert table.loc[("ordering", 0)].tolist() == ["in flight", "9,000", "0", "2.0"]
    assert table.loc[("ordering", 1)].tolist() == ["in flight", "", "0", "0.1"]
    assert table.loc[("indexing", 0)].tolist() == ["queued", "", "", ""]
    assert table.loc[("addition", 0), "state"] == "committed"


def test_after_a_machine_change_the_run_stands_where_its_last_sitting_left_it() -> None:
    # the checkpoint at 35,651 went with the old machine: the run restarted from step 0
    ledger = {"provenance": {"queue": [["ordering", 0]]},
              "runs": [{"task": "ordering", "seed": 0, "to_step": 35651,
                        "wall_seconds": 7200, "steps_lost": 0},
                       {"task": "ordering", "seed": 0, "to_step": 11000,
                        "wall_seconds": 3600, "steps_lost": 35651}]}
    table = tb.campaign_table(ledger, SimpleNamespace(docs={}))
    assert table.loc[("ordering", 0)].tolist() == ["in flight", "11,000", "35,651", "3.0"]
