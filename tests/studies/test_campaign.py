"""Tests of the paper-model campaign: the deadline, the queue's order, a clean stop right after
a checkpoint, and the ledger's account of each sitting (resumes, steps lost to a new machine).

The runs are stand-ins: a small process that writes a checkpoint folder every few tenths of a
second (as a training run does every CHECKPOINT_SECONDS) and, when told to, finishes."""

import subprocess
import sys
from datetime import datetime, timedelta, timezone

import pytest

from nopelib.results import files as results
from nopelib.studies import campaign

NOW = datetime(2026, 12, 5, 13, 0, tzinfo=timezone.utc)

# a stand-in run: a checkpoint folder every 0.2 s from the newest one there; with a step
# target it stops there and leaves a file that says the run is finished
FAKE_RUN = """
import sys, time
from pathlib import Path
folder, finish_at, done = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
folder.mkdir(parents=True, exist_ok=True)
step = max([int(p.name) for p in folder.iterdir()], default=0)
while True:
    time.sleep(0.2)
    step += 10
    (folder / f"{step:09d}").mkdir()
    if finish_at and step >= finish_at:
        done.write_text("finished")
        break
"""


def test_until_takes_a_duration_or_a_utc_time_and_names_what_it_refuses():
    assert campaign.parse_until("2h40m", NOW) == NOW + timedelta(hours=2, minutes=40)
    assert campaign.parse_until("90m", NOW) == NOW + timedelta(minutes=90)
    assert campaign.parse_until("300s", NOW) == NOW + timedelta(seconds=300)
    assert campaign.parse_until("15:30", NOW) == NOW.replace(hour=15, minute=30)
    assert campaign.parse_until("12:00", NOW) == NOW.replace(hour=12) + timedelta(days=1)
    for bad in ("", "soon", "2x", "25:00", "-1h", "1h 2m"):
        with pytest.raises(ValueError, match="--until="):
            campaign.parse_until(bad, NOW)


def test_the_queue_is_the_issue_s_order_and_every_run_once():
    assert campaign.QUEUE[:8] == (("ordering", 0), ("ordering", 1), ("ordering", 2),
                                  ("indexing", 0), ("indexing", 1), ("indexing", 2),
                                  ("addition", 0), ("addition", 2))
    assert len(set(campaign.QUEUE)) == len(campaign.QUEUE)
    assert {s for _, s in campaign.QUEUE[8:]} == {3, 4}


def test_pending_skips_committed_seeds_and_a_begun_run_goes_first(monkeypatch, tmp_path):
    held = {"ordering": {0}, "indexing": set(), "addition": {1}}
    monkeypatch.setattr(campaign, "committed_seeds", lambda folder, task: held[task])
    todo = campaign.pending(tmp_path)
    assert todo[:3] == [("ordering", 1), ("ordering", 2), ("indexing", 0)]
    assert ("ordering", 0) not in todo and ("addition", 0) in todo
    begun = {("indexing", 2)}
    assert campaign.next_run(todo, set(), lambda t, s: (t, s) in begun) == ("indexing", 2)
    assert campaign.next_run(todo, {("indexing", 2)}, lambda t, s: (t, s) in begun) == (
        "ordering", 1)
    assert campaign.next_run([], set(), lambda t, s: False) is None


def test_the_committed_study_files_give_the_queue_its_start():
    # the paper model's addition seed 1 is committed (and kept), so it is never queued
    assert 1 in campaign.committed_seeds(results.RESULTS_DIR, "addition")
    assert ("addition", 1) not in campaign.QUEUE
    assert set(campaign.pending(results.RESULTS_DIR)) <= set(campaign.QUEUE)


@pytest.fixture
def sitting(monkeypatch, tmp_path):
    """Run a sitting of stand-in runs: ``finish`` maps a run to the step it finishes at."""
    cache, out = tmp_path / "cache", tmp_path / "results"
    out.mkdir()
    monkeypatch.setenv("NOPELIB_CACHE_DIR", str(cache))
    monkeypatch.setattr(campaign, "MIN_START_SECONDS", 0)
    monkeypatch.setattr(campaign, "CHECKPOINT_SECONDS", 1)
    monkeypatch.setattr(campaign, "GRACE_SECONDS", 1)
    queue = [("ordering", 0), ("ordering", 1)]
    monkeypatch.setattr(campaign, "pending", lambda folder: [
        run for run in queue if not (tmp_path / f"done_{run[0]}_{run[1]}").exists()])
    monkeypatch.setattr(campaign, "committed_steps", lambda folder, task, seed: 999)

    def run(seconds: float, finish: dict, streams: int = 1) -> dict:
        def launch(task, seed, out_dir, logs):
            folder = cache / "checkpoints" / campaign.key_of(task, seed)
            done = tmp_path / f"done_{task}_{seed}"
            return subprocess.Popen([sys.executable, "-c", FAKE_RUN, str(folder),
                                     str(finish.get((task, seed), 0)), str(done)],
                                    start_new_session=True)
        until = datetime.now(timezone.utc) + timedelta(seconds=seconds)
        return campaign.run_campaign(until, out, streams, launch, poll=0.05, argv=["--x"])
    return run, cache, out


def test_a_sitting_stops_at_its_deadline_right_after_a_checkpoint_and_the_next_resumes(sitting):
    run, cache, out = sitting
    first = run(1.5, {})
    (record,) = first
    assert (record["task"], record["seed"], record["from_step"]) == ("ordering", 0, 0)
    assert not record["finished"] and record["to_step"] > 0
    newest = campaign.newest_step(cache / "checkpoints", record["key"])
    saved = results.load(out / campaign.LEDGER)["runs"][0]  # written at each checkpoint too
    assert saved["to_step"] == record["to_step"]
    # stopped within one checkpoint of the deadline: the newest checkpoint is the one it noted
    assert newest == record["to_step"]
    assert record["wall_seconds"] < 1.5 + 2.0
    second = run(1.0, {})
    assert second[0]["from_step"] == newest  # resumed here, nothing lost
    assert second[0]["steps_lost"] == 0
    ledger = results.load(out / campaign.LEDGER)
    assert [r["started"] for r in ledger["runs"]] == [record["started"], second[0]["started"]]
    assert ledger["runs"][0]["to_step"] == newest and ledger["runs"][1]["from_step"] == newest
    assert ledger["provenance"]["queue"][0] == ["ordering", 0]


def test_a_new_machine_s_lost_steps_are_counted_and_finished_runs_make_way(sitting):
    run, cache, out = sitting
    before = run(1.0, {})[0]
    for folder in (cache / "checkpoints").iterdir():  # another machine: no checkpoints
        for step in folder.iterdir():
            step.rmdir()
    after = run(30.0, {("ordering", 0): 40, ("ordering", 1): 20}, streams=2)
    first, second = after
    assert first["from_step"] == 0 and first["steps_lost"] == before["to_step"]
    assert first["finished"] and second["finished"] and first["to_step"] == 999
    assert first["streams"] == 2 and first["machine"] and first["cpu_capability"]


def test_main_refuses_a_bad_until_and_a_missing_folder_before_any_work(tmp_path, capsys):
    for argv, words in ((["--until", "later"], "--until='later'"),
                        (["--until", "1h", "--out-dir", str(tmp_path / "nope")], "--out-dir")):
        with pytest.raises(SystemExit) as exit_:
            campaign.main(argv)
        assert exit_.value.code == 2 and words in capsys.readouterr().err


def test_a_ledger_edited_by_hand_is_refused_naming_the_field(sitting, tmp_path):
    run, cache, out = sitting
    run(0.5, {})
    path = out / campaign.LEDGER
    doc = results.load(path)
    for field, value, words in (("to_step", -1, "to_step"), ("streams", 3, "streams"),
                                ("key", "abc", "key"), ("finished", "no", "finished")):
        bad = {**doc, "runs": [{**doc["runs"][0], field: value}]}
        with pytest.raises(results.ResultsError, match=words):
            results.validate(bad, "campaign", str(path))
    behind = {**doc, "runs": [{**doc["runs"][0], "from_step": 10**6}]}
    with pytest.raises(results.ResultsError, match="at least from_step"):
        results.validate(behind, "campaign", str(path))
    twice = {**doc, "runs": doc["runs"] * 2}
    with pytest.raises(results.ResultsError, match="repeats"):
        results.validate(twice, "campaign", str(path))


def test_a_run_left_in_flight_under_other_training_sources_names_its_commit():
    key = campaign.key_of("ordering", 0)
    record = dict(task="ordering", seed=0, key=key, to_step=500, finished=False,
                  commit="c" * 40, machine="vm")
    assert campaign.elsewhere([record], [("ordering", 0)]) == []  # same key: it resumes
    moved = {**record, "key": "f" * 32}
    (line,) = campaign.elsewhere([moved], [("ordering", 0)])
    assert "step 500" in line and "cccccccccccc" in line and "clone at that commit" in line
    assert campaign.elsewhere([{**moved, "finished": True}], [("ordering", 0)]) == []
    assert campaign.elsewhere([moved], [("indexing", 0)]) == []


def test_a_second_machine_change_loses_what_was_trained_since_the_first():
    # 35,651 steps, a new machine (from 0, lost 35,651), 9,641 steps, another new machine:
    # this start loses the 9,641, not 35,651 again
    ledger = [{"key": "k", "to_step": 35_651}, {"key": "k", "to_step": 9_641},
              {"key": "other", "to_step": 50_000},
              {"key": "k", "to_step": 70_000, "device": "cuda"}]  # no checkpoint returns
    assert campaign.reached_before(ledger, "k") == 9_641
    assert campaign.reached_before(ledger, "none yet") == 0
