"""Tests of the committed-results loader: every committed file is valid, and every kind of
damage is refused with the file and the field named."""

import copy
import json
import os

import pytest

from nopelib import results


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
