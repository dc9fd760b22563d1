"""The text-length study (nopelib.studies.text_length) on the tiny text profile: what a run
reads past its context, the temperature hook, the queue, and the file it writes."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from nopelib.core.model import GPT
from nopelib.results import files as results
from nopelib.rules import length_claims as rule
from nopelib.rules import length_kernels as rule_kernels
from nopelib.studies import text_length as tl
from nopelib.training.text_lm import REACH, TEXT_PROFILES

TINY = TEXT_PROFILES["text_tiny"]


def tiny_model(encoding: str, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(TINY.config(encoding, 65)).eval()


@pytest.fixture
def two_windows(monkeypatch: pytest.MonkeyPatch) -> np.ndarray:
    rows = tl.held_out(2)
    monkeypatch.setattr(tl, "held_out", lambda n=2: rows)
    return rows


def test_the_temperature_leaves_the_context_alone_and_moves_the_rest(two_windows) -> None:
    model = tiny_model("none")
    plain = tl.position_bits(model, two_windows[:, :257])
    with tl.log_length_temperature(model, TINY.context):
        sharp = tl.position_bits(model, two_windows[:, :257])
    assert np.array_equal(plain[:, :TINY.context], sharp[:, :TINY.context])
    assert not np.allclose(plain[:, TINY.context:], sharp[:, TINY.context:])
    after = tl.position_bits(model, two_windows[:, :257])  # the hooks are gone
    assert np.array_equal(plain, after)


def test_a_prefix_reads_as_a_shorter_window(two_windows) -> None:
    # what lets one pass give every length: the first n predictions of a causal model
    for encoding in ("none", "rope", "alibi"):
        model = tiny_model(encoding)
        full = tl.position_bits(model, two_windows[:, :513])
        short = tl.position_bits(model, two_windows[:, :257])
        np.testing.assert_allclose(full[:, :256], short, rtol=1e-4, atol=1e-5)


def test_read_model_gives_each_encoding_its_lengths(two_windows) -> None:
    # the tiny profile's context, 32, is below every length read: a learned table reads
    # one only at the text profile's context, where it stops
    at_context = replace(TINY, context=rule.LENGTH_CONTEXT)
    for encoding, prof in (("none", TINY), ("rope", TINY), ("learned", at_context)):
        torch.manual_seed(0)
        out = tl.read_model(GPT(prof.config(encoding, 65)).eval(), encoding, prof)
        lengths = rule.lengths_read(encoding, prof.context)
        assert sorted(map(int, out["bpc"])) == lengths
        assert sorted(map(int, out["scores"])) == lengths
        assert len(out["position_bits"]) == max(lengths) // rule.CURVE_BIN
        assert bool(out["sharpened"]) == (encoding == "none")
        for n in map(str, lengths):
            assert len(out["scores"][n]) == len(out["ordered"][n]) == prof.n_layer + 1
            assert all(0 <= x <= 1 for x in out["ordered"][n])
    assert lengths == [rule.LENGTH_CONTEXT]  # the learned table's


def test_the_queue_trains_the_compared_encodings_first() -> None:
    q = tl.queue(list(rule.LENGTH_ENCODINGS), [0, 1])
    assert q[:3] == [("none", 0), ("rope", 0), ("alibi", 0)]
    assert q[-2:] == [("learned", 0), ("learned", 1)]


def test_the_command_writes_a_checked_file_run_by_run(tmp_path, monkeypatch, two_windows
                                                      ) -> None:
    monkeypatch.setenv("NOPELIB_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "length_text_tiny.json"
    argv = ["--profile", "text_tiny", "--encodings", "none", "rope", "--seeds", "0",
            "--out", str(out)]
    tl.main(argv)
    doc = results.load(out)
    assert [(r["encoding"], r["seed"]) for r in doc["runs"]] == [("none", 0), ("rope", 0)]
    assert doc["runs"][0]["sharpened"] and not doc["runs"][1]["sharpened"]
    # an edited file is refused by its checks, naming the field
    bad = json.loads(out.read_text())
    bad["runs"][1]["sharpened"] = bad["runs"][0]["sharpened"]
    with pytest.raises(results.ResultsError, match="sharpened"):
        results.validate(bad, "length", "edited")


def test_no_run_starts_that_would_not_finish(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("NOPELIB_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "length_text.json"
    tl.main(["--seeds", "0", "--until", "10m", "--out", str(out)])
    assert "stopping before it" in capsys.readouterr().out and not out.exists()


def test_the_kernel_rerun_needs_a_cache_of_its_own(tmp_path, monkeypatch, capsys,
                                                 two_windows) -> None:
    out = tmp_path / rule_kernels.KERNEL_FILE
    argv = ["--profile", "text_tiny", "--encodings", "none", "--seeds", "0", "--out", str(out)]
    monkeypatch.delenv("NOPELIB_CACHE_DIR", raising=False)
    with pytest.raises(SystemExit):
        tl.main(argv)
    assert "NOPELIB_CACHE_DIR" in capsys.readouterr().err and not out.exists()
    # a run the cache holds from other kernels is refused, not written as this set's
    monkeypatch.setenv("NOPELIB_CACHE_DIR", str(tmp_path / "cache"))
    native = tl.length_run("none", 0, "text_tiny")
    monkeypatch.setattr(tl, "memo", lambda fn, *a: {**native, "kernels": "DEFAULT"})
    with pytest.raises(SystemExit, match="kernels"):
        tl.main(argv)
    assert not out.exists()


def test_bad_arguments_are_refused_naming_them(tmp_path, capsys) -> None:
    for argv, words in ((["--seeds", "-1"], "--seeds"),
                        (["--encodings", "sinusoidal"], "--encodings"),
                        (["--out", str(tmp_path / "text_x.json")], "length_<name>.json"),
                        (["--profile", "text_tiny", "--encodings", "learned"], "learned")):
        with pytest.raises(SystemExit):
            tl.main(argv)
        assert words in capsys.readouterr().err
    assert REACH == max(rule.LENGTH_LENGTHS)
