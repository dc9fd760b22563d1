"""Tests of the committed-results loader: every committed file is valid, and every kind of
damage is refused with the file and the field named."""

import copy
import json
import os
import time

import pytest

from nopelib.results import files as results


def test_every_committed_result_is_valid(monkeypatch):
    names = results.check_all()
    assert {"recipe_addition_reversal.json", "recipe_indexing_ordering.json"} <= set(names)
    # found from the package, whatever the working directory
    monkeypatch.chdir("/")
    assert results.load("recipe_addition_reversal.json")["runs"]


def _recipe() -> dict:
    return json.loads((results.RESULTS_DIR / "recipe_addition_reversal.json").read_text())


@pytest.mark.parametrize("where, value, field", [
    (("runs", 0, "accuracy"), float("nan"), "runs[0].accuracy"),
    (("runs", 0, "accuracy"), 7.0, "runs[0].accuracy"),
    (("runs", 1, "accuracy"), "1.0", "runs[1].accuracy"),
    (("runs", 0, "curve"), {"step": [1, 2], "accuracy": [0.5, float("nan")]}, "runs[0].curve"),
    (("runs", 0, "seed"), -1, "runs[0].seed"),
    (("runs", 0, "task"), "rev", "runs[0].task"),
    (("provenance", "wall_seconds"), -3, "provenance.wall_seconds"),
    (("provenance", "commit"), "HEAD", "provenance.commit"),
])
def test_damage_is_refused_naming_file_and_field(tmp_path, where, value, field):
    doc = _recipe()
    target = doc
    for key in where[:-1]:
        target = target[key]
    target[where[-1]] = value
    path = tmp_path / "recipe_edited.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(results.ResultsError) as err:
        results.load(path)
    assert str(path) in str(err.value) and field in str(err.value)


def test_missing_fields_broken_json_and_bad_names(tmp_path):
    doc = _recipe()
    del doc["runs"][2]["pos_encoding"]
    path = tmp_path / "recipe_x.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(results.ResultsError, match=r"runs\[2\].pos_encoding is missing"):
        results.load(path)
    path.write_text('{"provenance": ')
    with pytest.raises(results.ResultsError, match="recipe_x.json: cannot be read as JSON"):
        results.load(path)
    with pytest.raises(results.ResultsError, match="must start with"):
        results.load(tmp_path / "notes.json")
    os.mkfifo(tmp_path / "recipe_fifo.json")  # read as a file, never hangs
    with pytest.raises(results.ResultsError, match="not a regular file"):
        results.load(tmp_path / "recipe_fifo.json")


def test_a_recipe_whose_profile_cannot_rebuild_is_refused(tmp_path):
    doc = json.loads((results.RESULTS_DIR / "recipe_addition_reversal.json").read_text())
    bad = copy.deepcopy(doc)
    bad["provenance"]["training"]["lr"] = -1.0
    (tmp_path / "recipe_bad.json").write_text(json.dumps(bad))
    with pytest.raises(results.ResultsError, match="provenance.training"):
        results.load(tmp_path / "recipe_bad.json")
    bad = copy.deepcopy(doc)
    bad["runs"][0]["curve"]["accuracy"] = bad["runs"][0]["curve"]["accuracy"][:-1]
    (tmp_path / "recipe_bad.json").write_text(json.dumps(bad))
    with pytest.raises(results.ResultsError, match=r"runs\[0\].curve"):
        results.load(tmp_path / "recipe_bad.json")
    assert results.load_all("recipe", tmp_path / "none") == {}
    with pytest.raises(ValueError, match="kind="):
        results.load_all("nope")


def test_the_writer_puts_each_row_of_plain_values_on_one_line(tmp_path):
    doc = _recipe()
    doc["runs"][0]["grid"] = [[32, 0, 0.25], [32, 1, 0.5]]  # the long study's triples
    text = results.dumps(doc)
    assert json.loads(text) == doc
    assert '\n    [32, 1, 0.5]\n   ]' in text and '"step": [100, 200, 300' in text
    assert len(text) < 0.8 * len(json.dumps(doc, indent=1))
    path = tmp_path / "recipe_written.json"
    results.write(path, _recipe(), "recipe")
    assert results.load(path) == _recipe() and path.read_text().endswith("}\n")


# ---------------------------------------------------------------------------------------------
# the schema of every kind: each damage names the file and the field


def _committed(name: str) -> dict:
    return json.loads((results.RESULTS_DIR / name).read_text())


def _refused(tmp_path, name: str, doc: object) -> str:
    """The message of the ResultsError that loading ``doc``, written as ``name``, raises: it
    names the file."""
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    with pytest.raises(results.ResultsError) as err:
        results.load(path)
    assert str(path) in str(err.value)
    return str(err.value)


def _set(doc: dict, where: tuple, value: object) -> dict:
    target = doc
    for key in where[:-1]:
        target = target[key]
    target[where[-1]] = value
    return doc


REVERSAL = "trained_study_reversal.json"
PAPER = "trained_paper_study_reversal.json"


def test_a_tail_out_of_range_or_not_its_runs_is_refused(tmp_path):
    doc = _committed(REVERSAL)
    for run in doc["runs"]:  # dropped reversal from the judged tasks, silently
        run["tail"] = -1
    message = _refused(tmp_path, REVERSAL, doc)
    assert "runs[0].tail = -1: must be a share of the run's steps in [0, 1)" in message
    # in range, but not the share of the run after the step it was learned from
    doc = _set(_committed(REVERSAL), ("runs", 2, "tail"), 0.9)
    assert "runs[2].tail = 0.9: must be 0.5" in _refused(tmp_path, REVERSAL, doc)
    doc = _set(_committed(REVERSAL), ("runs", 1, "learned_from"), 250)
    assert "runs[1].learned_from = 250: must be 1750" in _refused(tmp_path, REVERSAL, doc)


@pytest.mark.parametrize("where, value, field", [
    (("rows", 3, "nrmse"), -50, "runs[0].probes.rows[3].nrmse = -50"),
    (("rows", 3, "nrmse"), float("nan"), "runs[0].probes.rows[3].nrmse = nan"),
    (("rows", 4, "r"), 1.5, "runs[0].probes.rows[4].r = 1.5: must be a Pearson r in [-1, 1]"),
    (("rows", 5, "features"), "cosin", "runs[0].probes.rows[5].features = 'cosin'"),
    (("rows", 0, "layer"), 5, "runs[0].probes.rows[0] (layer, features, seed) = (5,"),
    (("rows", 3, "features"), "cosine",
     "runs[0].probes.rows[3] repeats (layer, features, seed) = (0, 'cosine', 0)"),
    (("shuffled", 0, "r"), float("inf"), "runs[0].probes.shuffled[0].r = inf"),
    (("shuffled", 0, "layer"), 2, "runs[0].probes.shuffled[0] (layer, features, seed) = (2,"),
    (("probe_seeds",), [0, 0, 1], "runs[0].probes.probe_seeds = [0, 0, 1]"),
])
def test_damaged_probe_rows_are_refused(tmp_path, where, value, field):
    doc = _committed(REVERSAL)
    _set(doc["runs"][0]["probes"], where, value)
    assert field in _refused(tmp_path, REVERSAL, doc)


def test_a_probe_row_left_out_is_refused(tmp_path):
    doc = _committed(REVERSAL)
    del doc["runs"][1]["probes"]["rows"][7]
    assert ("runs[1].probes.rows lacks 1 (layer, features, seed) cells, e.g. (0, 'hidden', 1)"
            in _refused(tmp_path, REVERSAL, doc))
    doc = _set(_committed(REVERSAL), ("runs", 1, "probes", "w"), 8)  # another window
    assert "runs[1]: probes' settings" in _refused(tmp_path, REVERSAL, doc)


def test_a_seed_twice_more_seeds_than_the_profile_or_a_copied_run_is_refused(tmp_path):
    doc = _committed(REVERSAL)
    doc["runs"][1]["seed"] = 0
    assert "runs[1] repeats runs[0]'s seed = 0: each once" in _refused(tmp_path, REVERSAL, doc)
    doc = _committed(REVERSAL)  # a sixth model: seed 4's run copied under seed 5
    doc["runs"].append({**doc["runs"][4], "seed": 5, "key": "0" * 32})
    assert "runs[5].seed = 5: must be one of the study profile's seeds [0, 1, 2, 3, 4]" in (
        _refused(tmp_path, REVERSAL, doc))
    doc = _committed(PAPER)  # a study in flight: a copy fits the count, not the content
    if len(doc["runs"]) == 5:  # the study is complete: put it back in flight
        doc["runs"].pop()
    n, first = len(doc["runs"]), doc["runs"][0]["seed"]
    free = min(set(range(5)) - {r["seed"] for r in doc["runs"]})
    doc["runs"].append({**doc["runs"][0], "seed": free, "key": "0" * 32})
    assert (f"runs[{n}] (seed {free}) holds the same trajectory as runs[0] (seed {first}): a "
            "run copied under another seed number") in _refused(tmp_path, PAPER, doc)
    doc = _committed(REVERSAL)
    doc["runs"][3]["key"] = doc["runs"][0]["key"]
    assert "runs[3] repeats runs[0]'s key" in _refused(tmp_path, REVERSAL, doc)
    doc = _set(_committed(REVERSAL), ("provenance", "seeds"), [0, 1, 2, 4, 3])
    assert "provenance.seeds = [0, 1, 2, 4, 3]: must be the runs' seeds" in _refused(
        tmp_path, REVERSAL, doc)


@pytest.mark.parametrize("field, message", [
    ("tail", "runs[0].tail is missing"),
    ("decay_from", "runs[0].decay_from is missing"),
    ("probes", "runs[0].probes is missing"),
    ("trajectory", "runs[0].trajectory is missing"),
])
def test_a_missing_run_field_is_refused(tmp_path, field, message):
    doc = _committed(REVERSAL)
    del doc["runs"][0][field]
    assert message in _refused(tmp_path, REVERSAL, doc)


def test_missing_bookkeeping_and_fields_written_together_are_refused(tmp_path):
    doc = _committed(REVERSAL)
    del doc["provenance"]["runs_from_cache"]
    assert "provenance.runs_from_cache is missing" in _refused(tmp_path, REVERSAL, doc)
    doc = _committed(PAPER)
    del doc["runs"][0]["matrices"]  # the figure of the paper's model reads it
    assert "runs[0].matrices is missing" in _refused(tmp_path, PAPER, doc)
    doc = _committed(PAPER)
    doc["runs"][0]["matrices"]["layers"].pop()
    assert "runs[0].matrices.layers = " in _refused(tmp_path, PAPER, doc)
    doc = _committed(PAPER)
    doc["runs"][0]["matrices"]["layers"][2][0][1] = 1.5
    assert "runs[0].matrices.layers[2] must be a 22 x 22 matrix" in _refused(tmp_path, PAPER,
                                                                             doc)


def test_runs_of_other_layer_counts_are_refused(tmp_path):
    doc = _committed(REVERSAL)  # the study model has 4 layers: 5 scores with layer 0
    doc["runs"][2]["scores_init"].append(0.5)
    assert "runs[2].scores_init = [" in _refused(tmp_path, REVERSAL, doc)
    doc = _committed(REVERSAL)
    doc["runs"][2]["trajectory"]["scores"][3].pop()
    assert "runs[2].trajectory.scores[3] = [" in _refused(tmp_path, REVERSAL, doc)
    doc = _committed(REVERSAL)
    doc["runs"][2]["scores_after"][1] = 0.25
    assert "runs[2].scores_after must be the trajectory's last scores" in _refused(
        tmp_path, REVERSAL, doc)


def test_a_trained_file_must_be_named_after_its_profile_and_task(tmp_path):
    doc = _committed(REVERSAL)
    assert "its name must be trained_study_reversal.json" in _refused(
        tmp_path, "trained_study_ordering.json", doc)
    doc["runs"][1]["task"] = "ordering"
    assert "runs[1]: task = 'ordering': must be the same in every run" in _refused(
        tmp_path, REVERSAL, doc)


@pytest.mark.parametrize("name, where, value, field", [
    ("recipe_addition_reversal.json", ("runs", 2, "pos_encoding"), "learnd",
     "runs[2].pos_encoding = 'learnd': must be one of the recipe's encodings"),
    ("recipe_addition_reversal.json", ("provenance", "training", "name"), "cpu2",
     "provenance.profile = 'cpu': must be the name its training record holds ('cpu2')"),
    (PAPER, ("runs", 0, "dtype_policy"), "bf16", "runs[0].dtype_policy = 'bf16'"),
    ("precision_paper_study_reversal.json", ("runs", 3, "precision"), "bf16",
     "runs[3].precision = 'bf16': must be one of ['float32', 'bfloat16']"),
    ("precision_paper_study_reversal.json", ("runs", 3, "dtype_policy"), "float32",
     "runs[3].dtype_policy = 'float32': must be 'autocast-bfloat16' for a bfloat16 run"),
    ("kernels_study.json", ("runs", 0, "task"), ["reversal"], "runs[0].task = ['reversal']"),
    ("kernels_study.json", ("runs", 0, "inside"), False, "runs[0].inside = False"),
    ("kernels_study.json", ("runs", 1, "learned"), False, "runs[1].learned = False"),
    ("long_context.json", ("runs", 15, "window"), 10_000,
     "runs[15].window = 10000: must be null or an integer in [1, T=8192]"),
    ("long_context.json", ("runs", 0, "n_embd"), 100, "runs[0].n_embd = 100: must be a width"),
    ("long_context.json", ("provenance", "date"), "yesterday", "provenance.date = 'yesterday'"),
])
def test_values_outside_their_enumeration_are_refused(tmp_path, name, where, value, field):
    assert field in _refused(tmp_path, name, _set(_committed(name), where, value))


def test_a_profile_no_chapter_knows_is_refused(tmp_path):
    doc = _committed("recipe_addition_reversal.json")
    doc["provenance"]["profile"] = doc["provenance"]["training"]["name"] = "gpu"
    assert "provenance.profile = 'gpu': must be one of the profiles" in _refused(
        tmp_path, "recipe_addition_reversal.json", doc)


def test_incomplete_pairs_are_refused(tmp_path):
    doc = _committed("recipe_addition_reversal.json")  # "learned position nan"
    del doc["runs"][3]
    assert ("task, seed = ('reversal', 0) is run under pos_encoding ['none']: must be run "
            "under each of ['none', 'learned']") in _refused(tmp_path, "recipe_x.json", doc)
    doc = _committed("precision_paper_study_reversal.json")
    del doc["runs"][5]
    assert "is run under precision ['float32']" in _refused(tmp_path, "precision_x.json", doc)
    doc = _committed("kernels_study.json")
    doc["runs"][1]["seed"] = 1
    assert "is run under set ['native']" in _refused(tmp_path, "kernels_x.json", doc)


def test_the_precision_table_must_be_the_runs(tmp_path):
    name = "precision_paper_study_reversal.json"
    doc = _set(_committed(name), ("gaps", 2, "precision_gap"), 0.001)
    assert "gaps[2].precision_gap = 0.001: must be 0.0280" in _refused(tmp_path, name, doc)
    doc = _set(_committed(name), ("provenance", "verdict"), "changes")
    assert "provenance.verdict = 'changes': must be 'no change'" in _refused(tmp_path, name,
                                                                             doc)
    doc = _committed(name)
    doc["gaps"].pop()
    assert "gaps holds 7 rows: the runs give 8" in _refused(tmp_path, name, doc)


LONG = "long_context.json"


def test_long_runs_with_shifted_or_missing_layers_are_refused(tmp_path):
    doc = _committed(LONG)
    for row in doc["runs"][0]["scores"]:  # layers 1..7 of a 6-layer model
        row[1] += 1
    assert "runs[0].scores[6] = [32, 7, " in _refused(tmp_path, LONG, doc)
    doc = _committed(LONG)
    del doc["runs"][4]["scores"][8]
    assert "runs[4].scores lacks [length, layer] [64, 1]" in _refused(tmp_path, LONG, doc)
    doc = _committed(LONG)
    doc["runs"][4]["predicted_scores"].pop()
    assert "runs[4].predicted_scores must hold each length" in _refused(tmp_path, LONG, doc)
    doc = _committed(LONG)
    for row in doc["runs"][7]["order"]:
        row[0] += 1
    assert "runs[7].order[" in _refused(tmp_path, LONG, doc)
    doc = _committed(LONG)
    doc["runs"][7]["order"].pop()
    assert "runs[7].order lacks [layer, octave, d] [6, 8192," in _refused(tmp_path, LONG, doc)
    doc = _committed(LONG)
    doc["runs"][3]["seed"] = 1
    assert "runs[3] repeats runs[1]'s n_embd, window, seed" in _refused(tmp_path, LONG, doc)
    doc = _committed(LONG)
    doc["runs"].append({**doc["runs"][0], "seed": 5})
    assert "holds the same scores and order as runs[0] (seed 0)" in _refused(tmp_path, LONG,
                                                                             doc)


def _grid() -> dict:
    runs = [dict(profile="tiny", n_layer=2, n_embd=16, n_head=2, task="addition", seed=seed,
                 accuracy=0.5 + seed / 10, n_test=64, final_loss=1.0 + seed, train_seconds=2.0,
                 adjacency_before=[0.5, 0.8, 0.7], adjacency_after=[0.5, 0.75, 0.6 + seed / 10])
            for seed in (0, 1)]
    return {"provenance": results.provenance("test", [], 0.0, grid="tiny", backend="local"),
            "runs": runs}


def test_a_grid_summary_with_a_layer_missing_or_a_run_twice_is_refused(tmp_path):
    assert results.validate(_grid(), "grid")["runs"]
    doc = _grid()
    doc["runs"][1]["adjacency_after"].pop()  # would report layer 1 as the last
    assert ("runs[1].adjacency_after = [0.5, 0.75]: must be 3 scores, one per layer 0..2 of the "
            "2-layer model") in _refused(tmp_path, "grid_tiny.json", doc)
    doc = _set(_grid(), ("runs", 0, "n_layer"), 3)
    assert "runs[0].adjacency_before = " in _refused(tmp_path, "grid_tiny.json", doc)
    doc = _set(_grid(), ("runs", 1, "seed"), 0)
    assert "runs[1] repeats runs[0]'s n_layer, n_embd, task, seed" in _refused(
        tmp_path, "grid_tiny.json", doc)
    doc = _grid()
    doc["runs"].append({**doc["runs"][1], "seed": 2})
    assert "runs[2] (seed 2) holds the same results as runs[1]" in _refused(
        tmp_path, "grid_tiny.json", doc)
    doc = _set(_grid(), ("provenance", "backend"), "mpi")
    assert "provenance.backend = 'mpi': must be one of" in _refused(tmp_path, "grid_tiny.json",
                                                                    doc)


@pytest.mark.parametrize("text", ["[" * 200_000 + "]" * 200_000,
                                  '{"a": ' * 200_000 + "1" + "}" * 200_000])
def test_a_nesting_bomb_is_refused_quickly_naming_the_file(tmp_path, text):
    path = tmp_path / "trained_bomb.json"
    path.write_text(text)
    start = time.perf_counter()
    with pytest.raises(results.ResultsError, match="nested deeper") as err:
        results.load(path)
    assert str(path) in str(err.value) and time.perf_counter() - start < 10


def test_nesting_deeper_than_any_field_is_refused_before_it_is_read(tmp_path):
    deep: list = []
    for _ in range(200_000):  # a document built in Python: no parser stops it
        deep = [deep]
    doc = _recipe()
    doc["provenance"]["load_note"] = deep
    with pytest.raises(results.ResultsError, match=r"provenance.load_note\[0\]\[0\].* nested "
                                                   r"more than 16 levels deep"):
        results.write(tmp_path / "recipe_deep.json", doc, "recipe")
    assert not (tmp_path / "recipe_deep.json").exists()
    doc["provenance"]["load_note"] = json.loads("[" * 40 + "]" * 40)  # json reads it
    assert "provenance.load_note" in _refused(tmp_path, "recipe_deep.json", doc)


def test_a_key_given_twice_is_refused(tmp_path):
    path = tmp_path / "recipe_merged.json"
    text = (results.RESULTS_DIR / "recipe_addition_reversal.json").read_text()
    path.write_text(text.replace('"scale": 4,', '"scale": 4,\n "scale": 40,', 1))
    with pytest.raises(results.ResultsError, match="the key 'scale' appears twice") as err:
        results.load(path)
    assert str(path) in str(err.value)


def test_the_machine_names_its_cpu(tmp_path, monkeypatch):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9R14\n"
                    "processor\t: 1\nmodel name\t: AMD EPYC 9R14\n")
    monkeypatch.setattr(results.platform, "machine", lambda: "x86_64")
    assert results.cpu_name(info) == "AMD EPYC 9R14 (x86_64)"
    # no cpuinfo (macOS, Windows): what platform knows, the architecture at least
    monkeypatch.setattr(results.platform, "processor", lambda: "arm")
    assert results.cpu_name(tmp_path / "absent") == "arm (x86_64)"
    monkeypatch.setattr(results.platform, "processor", lambda: "")
    assert results.cpu_name(tmp_path / "absent") == "x86_64"
    machine = results.provenance("test", [], 0.0)["machine"]
    assert results.cpu_name() in machine and f"{os.cpu_count()} cores" in machine
