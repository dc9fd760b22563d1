"""The committed text study as tables: scores, bits per character, curves, probes and samples.

``nopelib.studies.text_study`` writes ``book/results/text_<profile>.json``, one run per
(encoding, seed); the text chapter reads it through these tables, and judges it by
``nopelib.rules.beyond_claims.text_claims`` on ``frames(doc)["scores"]`` and ``["bpc"]``.
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from nopelib.core.stats import t_interval


def frames(doc: Mapping) -> dict[str, pd.DataFrame]:
    """The runs of a text study file as long tables:

    - ``scores``: encoding, stage ("init" or "trained"), seed, layer, length, score (the mean
      over that length's held-out windows) and sd (over the windows);
    - ``bpc``: encoding, seed, steps, val_bpc, test_bpc, train_seconds;
    - ``curves``: encoding, seed, step and each learning-curve series the run recorded;
    - ``probes``: stage, encoding, seed (the model's), length, layer, features, probe_seed,
      nrmse, r;
    - ``samples``: encoding, seed, prompt, text."""
    scores, bpc, curves, probes, samples = [], [], [], [], []
    for run in doc["runs"]:
        unit = dict(encoding=run["encoding"], seed=run["seed"])
        for stage, by_length in run["scores"].items():
            for length, s in by_length.items():
                scores += [dict(unit, stage=stage, layer=layer, length=int(length), score=m,
                                sd=sd) for layer, (m, sd) in enumerate(zip(s["mean"], s["sd"]))]
        bpc.append(dict(unit, steps=run["steps"], val_bpc=run["val_bpc"],
                        test_bpc=run["test_bpc"], train_seconds=run["train_seconds"]))
        curve = run["curve"]
        series = [k for k, v in curve.items() if k != "step" and not isinstance(v[0], list)]
        curves += [dict(unit, step=step, **{k: curve[k][i] for k in series})
                   for i, step in enumerate(curve["step"])]
        probes += [dict(unit, stage=p["stage"], length=p["length"], layer=p["layer"],
                        features=p["features"], probe_seed=p["seed"], nrmse=p["nrmse"],
                        r=p["r"]) for p in run["probes"]]
        samples += [dict(unit, prompt=s["prompt"], text=s["text"]) for s in run["samples"]]
    return {"scores": pd.DataFrame(scores), "bpc": pd.DataFrame(bpc),
            "curves": pd.DataFrame(curves), "probes": pd.DataFrame(probes),
            "samples": pd.DataFrame(samples)}


def bpc_summary(bpc: pd.DataFrame, baseline: float, level: float = 0.95) -> pd.DataFrame:
    """Bits per character per encoding: the mean over seeds and its t interval at ``level``
    (validation and test books), the seeds below the unigram ``baseline`` on the test books,
    and one more row, "NoPE - learned", of the test bits paired by seed (what NoPE pays)."""
    rows = []
    for encoding, group in bpc.groupby("encoding", sort=False):
        row = {"encoding": encoding, "seeds": len(group)}
        for split in ("val_bpc", "test_bpc"):
            mean, lo, hi = t_interval(group[split].to_numpy(float), level)
            row |= {split: mean, f"{split} lo": lo, f"{split} hi": hi}
        row["below baseline"] = int((group["test_bpc"] < baseline).sum())
        rows.append(row)
    paired = bpc.pivot_table(index="seed", columns="encoding", values="test_bpc")
    if {"none", "learned"} <= set(paired.columns):
        diff = (paired["none"] - paired["learned"]).dropna().to_numpy()
        if len(diff):
            mean, lo, hi = t_interval(diff, level)
            rows.append({"encoding": "NoPE - learned", "seeds": len(diff), "test_bpc": mean,
                         "test_bpc lo": lo, "test_bpc hi": hi})
    return pd.DataFrame(rows)


def score_summary(scores: pd.DataFrame, level: float = 0.95) -> pd.DataFrame:
    """The adjacency score per encoding, stage, length and layer: the mean over seeds and its
    t interval at ``level`` (NaN bounds with too few seeds: ``stats.t_interval``)."""
    rows = []
    keys = ["encoding", "stage", "length", "layer"]
    for key, group in scores.groupby(keys, sort=True):
        mean, lo, hi = t_interval(group["score"].to_numpy(float), level)
        rows.append(dict(zip(keys, key), seeds=len(group), score=mean, lo=lo, hi=hi))
    return pd.DataFrame(rows)
