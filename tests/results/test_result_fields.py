"""Issue 62 (item 3): every field of a result has its physical range, checked at load, and a
committed file edited by hand is refused by its digest in the folder's manifest.

Each case edits one field of a copy of a committed file in a temporary folder (never
book/results) and expects a ResultsError naming the file and the field."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import pytest

from nopelib.results import files as results, manifest
from nopelib.results.manifest import MANIFEST_NAME


def _committed(name: str) -> dict:
    return json.loads((results.RESULTS_DIR / name).read_text())


def _set(doc: dict, where: tuple, value: object) -> None:
    """Set (or with value DELETE, delete) the field at ``where``."""
    parent = doc
    for key in where[:-1]:
        parent = parent[key]
    if value is DELETE:
        del parent[where[-1]]
    else:
        parent[where[-1]] = value


DELETE = object()
EARLY, TEXT = "early_paper_study.json", "text_text.json"
TRAINED, PAPER = "trained_study_reversal.json", "trained_paper_study_reversal.json"
NAN = float("nan")
FIELDS = [  # (file, field, value, what the error names)
    (EARLY, ("runs", 0, "curve", "loss", 0), NAN, "runs[0].curve.loss[0]"),
    (EARLY, ("runs", 0, "curve", "loss", 0), "oops", "runs[0].curve.loss[0]"),
    (EARLY, ("runs", 0, "curve", "entropy", 1), -4.0, "runs[0].curve.entropy[1]"),
    (EARLY, ("runs", 0, "curve", "entropy", 1), 1.5, "runs[0].curve.entropy[1]"),
    (EARLY, ("runs", 0, "curve", "rho", 2), 1e12, "runs[0].curve.rho[2]"),
    (EARLY, ("runs", 0, "curve", "rho", 2), 0.5, "runs[0].curve.rho[2]"),  # not e_rms / u_rms
    (EARLY, ("runs", 0, "curve", "lr", 0), -1.0, "runs[0].curve.lr[0]"),
    (EARLY, ("runs", 0, "curve", "lr", 0), 0.5, "runs[0].curve.lr[0]"),  # above the profile's
    (EARLY, ("runs", 0, "curve", "value_rms", 0), "oops", "runs[0].curve.value_rms[0]"),
    (EARLY, ("runs", 0, "measure_init", "predicted"), 7.5, "runs[0].measure_init.predicted"),
    (EARLY, ("runs", 0, "measure_init", "predicted"), DELETE,
     "runs[0].measure_init.predicted is missing"),
    (EARLY, ("runs", 0, "measure_init", "entropy"), -4.0, "runs[0].measure_init.entropy"),
    (EARLY, ("runs", 0, "measure_init", "rho"), 1e12, "runs[0].measure_init.rho"),
    (EARLY, ("provenance", "seeds"), [0, 1, 2, 3, 4, 5, 6], "provenance.seeds"),
    (TEXT, ("runs", 0, "test_bpc"), 1e12, "runs[0].test_bpc"),
    (TEXT, ("runs", 0, "val_bpc"), -1.0, "runs[0].val_bpc"),
    (TEXT, ("runs", 0, "curve", "val_bpc", 0), 9.0, "runs[0].curve.val_bpc[0]"),
    (TEXT, ("runs", 0, "curve", "lr", 0), -1.0, "runs[0].curve.lr[0]"),
    (TEXT, ("runs", 0, "loss_curve", 0), NAN, "runs[0].loss_curve"),
    (TEXT, ("runs", 0, "probes", 0, "nrmse"), 1e6, "runs[0].probes[0].nrmse"),
    (TEXT, ("runs", 0, "probes", 0, "r"), 1.5, "runs[0].probes[0].r"),
    (TEXT, ("runs", 0, "scores", "init", "32", "sd", 0), 3.0, "runs[0].scores.init.32.sd"),
    (TEXT, ("provenance", "windows", "split"), "train!", "provenance.windows.split"),
    (TEXT, ("provenance", "unigram_bpc"), 1e12, "provenance.unigram_bpc"),
    (TRAINED, ("runs", 0, "probes", "rows", 0, "nrmse"), 1e6, "runs[0].probes.rows[0].nrmse"),
    (TRAINED, ("runs", 0, "probes", "shuffled", 0, "r"), -2.0,
     "runs[0].probes.shuffled[0].r"),
    (TRAINED, ("runs", 0, "decay_from"), None, "runs[0].decay_from"),  # 3,000 of 60,000 steps
    (TRAINED, ("runs", 0, "decay_from"), 2500, "runs[0].decay_from"),  # no tail after it
    (TRAINED, ("runs", 0, "trajectory", "loss", 0), "oops", "runs[0].trajectory.loss[0]"),
    (TRAINED, ("runs", 0, "train_seconds"), 1e12, "runs[0].train_seconds"),
    (PAPER, ("runs", 0, "matrices", "layers", 1, 0, 0), 0.2, "runs[0].matrices.layers[1][0][0]"),
    (PAPER, ("runs", 1, "dtype_policy"), "float32", "dtype_policy"),
    ("precision_paper_study_addition.json", ("provenance", "cpu_capability"), "",
     "provenance.cpu_capability"),
    ("recipe_addition_reversal.json", ("runs", 0, "curve", "loss", 0), -1.0,
     "runs[0].curve.loss[0]"),
]


@pytest.mark.parametrize("name, where, value, field", FIELDS,
                         ids=[f"{n.split('.')[0]}-{f}" for n, _, _, f in FIELDS])
def test_each_field_out_of_its_range_is_refused_naming_the_file_and_field(tmp_path, name, where,
                                                                           value, field):
    doc = _committed(name)
    results.load(name)  # the committed file itself loads
    _set(doc, where, value)
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    with pytest.raises(results.ResultsError) as err:
        results.load(path)
    message = str(err.value)
    assert message.startswith(str(path)) and field in message, message
    assert "\n" not in message


def test_a_trained_run_of_a_float32_profile_ran_in_float32(tmp_path):
    doc = _committed(PAPER)
    doc["provenance"]["training"]["precision"] = "float32"
    doc["provenance"]["training"]["name"] = doc["provenance"]["profile"]
    with pytest.raises(results.ResultsError, match="dtype_policy.*trains in float32"):
        results.validate(doc, "trained", "f32")


def test_every_committed_file_is_signed_in_the_manifest():
    digests = manifest.read_manifest(results.RESULTS_DIR)
    for name in results.check_all():
        data = (results.RESULTS_DIR / name).read_bytes()
        assert digests[name] == hashlib.sha256(data).hexdigest()


def _signed_copy(tmp_path: Path, name: str) -> Path:
    """A copy of the committed file ``name`` in a folder of its own, signed there."""
    path = tmp_path / name
    path.write_bytes((results.RESULTS_DIR / name).read_bytes())
    results.sign(path)
    assert results.load(path)
    return path


@pytest.mark.parametrize("edit", ["accuracy", "key"])
def test_a_plausible_edit_by_hand_is_refused_by_the_digest(tmp_path, edit):
    path = _signed_copy(tmp_path, TRAINED)
    doc = json.loads(path.read_text())
    run = doc["runs"][0]
    if edit == "accuracy":
        run["accuracy"] = 0.5 if run["accuracy"] > 0.9 else 0.99
    else:
        run["key"] = "0" * 32
    results.validate(copy.deepcopy(doc), "trained", "edited")  # in range: the schema passes
    path.write_text(results.dumps(doc) + "\n")
    with pytest.raises(results.ResultsError) as err:
        results.load(path)
    message = str(err.value)
    assert message.startswith(f"{path}: its bytes have SHA-256") and "\n" not in message
    assert f"{manifest.SIGN_COMMAND} {path}" in message


def test_a_file_without_an_entry_is_refused_where_a_manifest_is_kept(tmp_path):
    _signed_copy(tmp_path, TRAINED)
    other = tmp_path / "recipe_addition_reversal.json"
    other.write_bytes((results.RESULTS_DIR / other.name).read_bytes())
    with pytest.raises(results.ResultsError, match=rf"{other}: .*{MANIFEST_NAME} has no digest"):
        results.load(other)
    with pytest.raises(results.ResultsError, match="has no digest"):
        results.check_all(tmp_path)


def test_the_committed_folder_is_held_to_its_manifest(tmp_path, monkeypatch):
    path = tmp_path / TRAINED
    path.write_bytes((results.RESULTS_DIR / TRAINED).read_bytes())
    results.load(path)  # a folder without a manifest: the schema only
    monkeypatch.setattr(results, "RESULTS_DIR", tmp_path)
    with pytest.raises(results.ResultsError, match="has no digest"):
        results.load(path)


def test_write_records_the_digest_of_what_it_wrote(tmp_path):
    doc = _committed("recipe_addition_reversal.json")
    path = tmp_path / "recipe_addition_reversal.json"
    results.write(path, doc, "recipe")
    assert manifest.read_manifest(tmp_path) == {
        path.name: hashlib.sha256(path.read_bytes()).hexdigest()}
    doc["runs"][0]["train_seconds"] += 1.0
    results.write(path, doc, "recipe")  # re-read under the lock: the old digest matches
    assert manifest.read_manifest(tmp_path)[path.name] == hashlib.sha256(
        path.read_bytes()).hexdigest()
    assert results.load(path)["runs"][0]["train_seconds"] == doc["runs"][0]["train_seconds"]


def test_sign_refuses_an_invalid_file_and_signs_a_valid_one(tmp_path, capsys):
    good = tmp_path / TRAINED
    good.write_bytes((results.RESULTS_DIR / TRAINED).read_bytes())
    bad = tmp_path / PAPER
    doc = _committed(PAPER)
    doc["runs"][0]["accuracy"] = 7.0
    bad.write_text(json.dumps(doc))
    with pytest.raises(SystemExit) as err:
        results.main(["--sign", str(good), str(bad)])
    assert err.value.code == 2
    assert f"{bad}: runs[0].accuracy = 7.0" in capsys.readouterr().err
    assert not (tmp_path / MANIFEST_NAME).exists()  # nothing signed
    results.main(["--sign", str(good)])
    assert f"signed {good}" in capsys.readouterr().out
    bad.unlink()
    assert results.check_all(tmp_path) == [TRAINED]


def test_a_broken_manifest_is_named(tmp_path):
    path = _signed_copy(tmp_path, TRAINED)
    (tmp_path / MANIFEST_NAME).write_text("{nope")
    with pytest.raises(results.ResultsError, match=f"{tmp_path / MANIFEST_NAME}: cannot be read"):
        results.load(path)
