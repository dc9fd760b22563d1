"""The probe studies the probes chapter runs, and how their tables are summarised and judged.

``nopelib.core.probe`` is the probe (features, fits, every layer of a model); this module holds
what the chapter and the trained-model study do with it: the inputs a study probes (random
token sequences for a random model, a trained run's own held-out sequences, as many as give a
fixed number of fitting tokens), one call per study (``random_study``, ``trained_study``), and
the tables the chapter reads (``summary``, ``paired_differences``, ``metric_intervals``, and
the verdict wording). The planted controls of the comparison (``planted_study``: synthetic
states with position only in the variance or only in the adjacency, ``nopelib.core.planted``)
and the trained verdict on format-subtracted values (``trained_comparison``) are here too.
The rules of the chapter's parameters are the chapter's own (``nopelib.book.probes``).
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from nopelib.core.features import (FEATURE_SETS, model_states, random_token_sequences,
                                   window_positions)
from nopelib.core.model import GPT, GPTConfig
from nopelib.core.planted import EXPECTED, PLANTED, planted_states
from nopelib.core.probe import ProbeConfig, RidgeConfig, probe_layers, probe_model
from nopelib.core.stats import t_interval
from nopelib.core.tasks import CHARS, encode_batch, make_split
from nopelib.rules import init_claims
from nopelib.store.memo import memo
from nopelib.core.one_model import random_model
from nopelib.training.runs import TrainedRun
from nopelib.training.train_profile import TrainProfile


def _is_count(value: object) -> bool:
    """A positive integer of any integer type (numpy's too), but not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 1


def sequences_for(n_tokens: int, T: int, w: int, config: RidgeConfig | ProbeConfig) -> int:
    """How many length-T sequences give at least ``n_tokens`` probed tokens to the fit split
    (positions w..T-1, after the test and validation sequences are held out)."""
    if not _is_count(n_tokens):
        raise ValueError(f"n_tokens={n_tokens!r} must be a positive integer")
    fit_frac = (1 - config.test_frac) * (1 - config.val_frac)
    return int(np.ceil(n_tokens / (fit_frac * len(window_positions(T, w))))) + 2


def task_sequences(task: str, seed: int, prof: TrainProfile, fit_tokens: int, w: int,
                   config: RidgeConfig | ProbeConfig) -> tuple[torch.Tensor, np.ndarray]:
    """The first test examples of a trained run as the model saw sequences in training (input,
    answer; teacher forcing), as many as give ``fit_tokens`` probed tokens (positions w..)
    to the fit split on average, whatever the task's lengths: right-padded ids [n, T] and real
    lengths [n]. These are held out from training but in distribution: format, lengths and
    tokens of the task."""
    if not _is_count(fit_tokens):
        raise ValueError(f"fit_tokens={fit_tokens!r} must be a positive integer")
    test = make_split(task, seed, n_train=prof.n_train, n_test=prof.n_test).test
    lengths = np.array([len(x) + len(a) for x, a in test])  # the end token is never an input
    fit_frac = (1 - config.test_frac) * (1 - config.val_frac)
    probed = np.cumsum(np.clip(lengths - w, 0, None))  # [n_test]
    n = int(np.searchsorted(probed, fit_tokens / fit_frac)) + 1
    if n > len(test):
        raise ValueError(f"fit_tokens={fit_tokens:,} needs more than the {len(test):,} test "
                         f"sequences of {task} at w={w}")
    idx, _ = encode_batch(test[:n])  # [n, T]
    return idx, lengths[:n]


def summary(table: pd.DataFrame) -> pd.DataFrame:
    """Mean and sample std over seeds of NRMSE and R: one row per layer, columns per feature set."""
    stats = table.groupby(["layer", "features"])[["nrmse", "r"]].agg(["mean", "std"])
    return stats.unstack("features")


def paired_differences(table: pd.DataFrame, unit: str | list[str] = "seed",
                       a: str = "cosine", b: str = "variance") -> pd.DataFrame:
    """Feature set ``a`` minus ``b`` for NRMSE and R, paired within each (layer, ``unit``) (same
    model, data and split; ``unit`` may name several columns, e.g. model and probe seed): one
    row per pair, columns layer, the unit columns, d_nrmse, d_r."""
    keys = ["layer", *([unit] if isinstance(unit, str) else unit)]
    wide = table[table.features.isin([a, b])].pivot_table(
        index=keys, columns="features", values=["nrmse", "r"])
    if wide.isna().any().any() or {a, b} - set(wide.columns.get_level_values(1)):
        raise ValueError(f"every (layer, {unit}) needs both {a!r} and {b!r} rows")
    return pd.DataFrame({"d_nrmse": wide[("nrmse", a)] - wide[("nrmse", b)],
                         "d_r": wide[("r", a)] - wide[("r", b)]}).reset_index()


def metric_intervals(table: pd.DataFrame, unit: str = "seed",
                     level: float = 0.95) -> pd.DataFrame:
    """Mean NRMSE and R per (layer, feature set) over models (``unit``; rows of one model,
    e.g. its probe seeds, are averaged first), each with its Student t interval at ``level``
    (``stats.t_interval``): columns nrmse, nrmse lo, nrmse hi, r, r lo, r hi, n."""
    per_unit = table.groupby(["layer", "features", unit], as_index=False)[["nrmse", "r"]].mean()
    rows = []
    for (layer, kind), group in per_unit.groupby(["layer", "features"]):
        row = dict(layer=layer, features=kind, n=len(group))
        for metric in ("nrmse", "r"):
            mean, lo, hi = t_interval(group[metric].to_numpy(), level)
            row.update({metric: mean, f"{metric} lo": lo, f"{metric} hi": hi})
        rows.append(row)
    return pd.DataFrame(rows).set_index(["layer", "features"])


# ---------------------------------------------------------------------------------------------
# the probes chapter: its two studies and how it reports them

def random_study(seed: int, T: int, windows: list[int], fit_tokens: int,
                 config: RidgeConfig | ProbeConfig, shuffle_layers: tuple[int, ...] = (),
                 layers: list[int] | None = None, kinds: tuple[str, ...] = FEATURE_SETS,
                 **model: object) -> pd.DataFrame:
    """Probe table of the random model of ``seed`` (GPTConfig overrides in ``model``) at
    ``layers`` (all: None) with ``kinds``, and the shuffled-target control at
    ``shuffle_layers`` from the same forward pass.

    The model reads i.i.d. uniform sequences of ``T`` characters, as many as give each probe
    ``fit_tokens`` fitting tokens at the largest window (``sequences_for``), drawn with
    ``seed``, which also seeds the probe. One row per (w, layer, features, seed) with columns
    nrmse, r, w and shuffled (True for the control's rows, fitted at the first window)."""
    n_seq = sequences_for(fit_tokens, T, max(windows), config)
    ids = random_token_sequences(n_seq, T, CHARS, seed=seed)  # [n_seq, T]
    net = random_model(seed=seed, block_size=max(T, GPTConfig().block_size), **model)
    states = model_states(net, ids)  # [L+1, n_seq, T, d]
    tables = [probe_layers(states, w, [seed], kinds, layers, config)
              .assign(w=w, shuffled=False) for w in windows]
    if shuffle_layers:
        control = probe_layers(states, windows[0], [seed], layers=list(shuffle_layers),
                               config=config, shuffle_targets=True)
        tables.append(control.assign(w=windows[0], shuffled=True))
    return pd.concat(tables, ignore_index=True)


def random_studies(model_seeds: Sequence[int], T: int, w: int, fit_tokens: int,
                   config: RidgeConfig) -> pd.DataFrame:
    """The probes chapter's random-init comparison: ``random_study`` of every model seed at
    window ``w`` (cached, ``nopelib.store.memo``), with the shuffled-target control at layer 1 and
    the last layer on the first seed's model."""
    last = GPTConfig().n_layer
    return pd.concat([memo(random_study, s, T, [w], fit_tokens, config,
                           shuffle_layers=(1, last) if s == model_seeds[0] else ())
                      for s in model_seeds], ignore_index=True)


def mlp_studies(model_seeds: Sequence[int], T: int, w: int, fit_tokens: int) -> pd.DataFrame:
    """The paper's probe (a 4-layer MLP, ``ProbeConfig``) on the random-init comparison's
    models and windows, cosine and variance features only (cached, ``nopelib.store.memo``)."""
    return pd.concat([memo(random_study, s, T, [w], fit_tokens, ProbeConfig(),
                           kinds=("cosine", "variance")) for s in model_seeds],
                     ignore_index=True)


def planted_study(kind: str, seed: int, T: int, w: int, fit_tokens: int,
                  config: RidgeConfig | ProbeConfig) -> pd.DataFrame:
    """The cosine and variance probes of the chapter on planted states (``nopelib.core.planted``)
    of ``kind`` and ``seed``, shaped like the base model's residual streams (its depth and
    width, ``GPTConfig``): as many length-``T`` sequences as give each probe ``fit_tokens``
    fitting tokens at window ``w`` (``sequences_for``), every layer, ``seed`` also seeding
    the probe. One row per (layer, features) with columns layer, features, seed, nrmse, r
    and planted (``kind``)."""
    base = GPTConfig()
    n_seq = sequences_for(fit_tokens, T, w, config)
    states = planted_states(kind, n_seq, T, d=base.n_embd, n_layer=base.n_layer, seed=seed)
    table = probe_layers(states, w, [seed], ("cosine", "variance"), None, config)
    return table.assign(planted=kind)


def planted_studies(seeds: Sequence[int], T: int, w: int, fit_tokens: int,
                    config: RidgeConfig | ProbeConfig) -> pd.DataFrame:
    """``planted_study`` of both planted kinds (``nopelib.core.planted.PLANTED``) for every seed
    (cached, ``nopelib.store.memo``), one table."""
    return pd.concat([memo(planted_study, kind, s, T, w, fit_tokens, config)
                      for kind in PLANTED for s in seeds], ignore_index=True)


def planted_comparison(table: pd.DataFrame) -> pd.DataFrame:
    """``init_claims.probe_claims`` of each planted kind of ``planted_studies``'s table, the seed
    as the unit; each kind is a family of its own (its layers >= 1, both metrics), as one
    model's comparison is. Indexed by (planted, layer), with the verdict the kind must give
    (``expected``, ``nopelib.core.planted.EXPECTED``)."""
    comps = {kind: init_claims.probe_claims(paired_differences(group, "seed"), model="seed")
             for kind, group in table.groupby("planted", sort=False)}
    if not comps:
        raise ValueError("planted_comparison: the table holds no planted rows")
    comp = pd.concat(comps, names=["planted"])
    return comp.assign(expected=[EXPECTED[k] for k in comp.index.get_level_values(0)])


# per expected verdict: the bound of each metric that decides it, and the sign that makes its
# distance from 0 positive on that verdict's side (the claim says d_nrmse < 0 and d_r > 0)
_EXPECTED_SIDES = {"cosine": {"nrmse": ("hi", -1.0), "r": ("lo", 1.0)},
                   "variance": {"nrmse": ("lo", 1.0), "r": ("hi", -1.0)}}


def planted_margins(comp: pd.DataFrame) -> pd.DataFrame:
    """How far ``planted_comparison``'s bounds lie from 0 on the side of each kind's expected
    verdict, at its worst layer. For "cosine" the bounds are the claim's side (NRMSE hi, R
    lo: "holds" needs both beyond 0); for "variance" the other side (NRMSE lo, R hi: "fails"
    needs either beyond 0, and both are shown). One row per kind: expected, the layers at the
    expected verdict out of all, and per metric the worst bound, its layer and its margin
    (the bound's distance from 0 towards the expected side: > 0 when on that side)."""
    rows = []
    for kind, group in comp.groupby(level="planted", sort=False):
        group = group.droplevel("planted")
        expected = group["expected"].iloc[0]
        row = dict(planted=kind, expected=expected,
                   at_expected=f"{int((group.verdict == expected).sum())} of {len(group)}")
        for metric, (side, sign) in _EXPECTED_SIDES[expected].items():
            bound = group[f"d_{metric} {side}"]  # [layer]
            margin = sign * bound
            worst = margin.idxmin()
            row.update({f"{metric} bound": f"d_{metric} {side}",
                        f"{metric} worst": bound[worst], f"{metric} layer": worst,
                        f"{metric} margin": margin[worst]})
        rows.append(row)
    return pd.DataFrame(rows).set_index("planted")


def format_subtracted(table: pd.DataFrame,
                      unit: str | Sequence[str] = "model_seed") -> pd.DataFrame:
    """Every layer's NRMSE and R minus the same model's layer 0, per feature set: what a
    trained model computes beyond its task's format (layer 0 holds the token embeddings of
    the same inputs, whose position signal is the format's). ``unit`` names the model (one
    column or several, e.g. task and model seed); a model's other rows (its probe seeds) are
    averaged first. One row per (layer >= 1, feature set, model): columns layer, features,
    the unit columns, nrmse, r."""
    keys = [unit] if isinstance(unit, str) else list(unit)
    per_unit = table.groupby(["layer", "features", *keys])[["nrmse", "r"]].mean()
    if 0 not in per_unit.index.get_level_values("layer"):
        raise ValueError("format subtraction needs layer 0 rows: the format's own signal")
    base = per_unit.xs(0, level="layer")  # [features, *unit]
    lift = per_unit.drop(index=0, level="layer") - base  # aligned on (features, *unit)
    if lift.isna().any().any():
        raise ValueError("every (layer, feature set, model) needs its model's layer 0 row")
    return lift.reset_index()


def format_lift(table: pd.DataFrame, unit: str = "model_seed",
                level: float = 0.95) -> pd.DataFrame:
    """What a trained model computes beyond its task's format (``format_subtracted``: every
    layer's NRMSE and R minus the same model's layer 0), per feature set, with a Student t
    interval over models (``unit``) at ``level``, one layer at a time (a description, not a
    family). One row per (layer, feature set) from layer 1: columns nrmse lift, nrmse lo,
    nrmse hi, r lift, r lo, r hi, n."""
    lift = format_subtracted(table, unit)
    rows = []
    for (layer, kind), group in lift.groupby(["layer", "features"]):
        row = dict(layer=layer, features=kind, n=len(group))
        for metric in ("nrmse", "r"):
            mean, lo, hi = t_interval(group[metric].to_numpy(), level)
            row.update({f"{metric} lift": mean, f"{metric} lo": lo, f"{metric} hi": hi})
        rows.append(row)
    return pd.DataFrame(rows).set_index(["layer", "features"])


def compare_trained(table: pd.DataFrame, subtract_format: bool = False) -> pd.DataFrame:
    """``init_claims.probe_claims`` per task and layer of a trained-model probe table (columns
    task, model_seed, seed, layer, features, nrmse, r), the model as the unit and its probe
    seeds averaged first. Raw (default): cosine minus variance at each layer.
    ``subtract_format``: each layer's metrics minus the same model's layer 0
    (``format_subtracted``) before cosine is paired against variance, so that the comparison
    reads what each feature set gained over the token embeddings, not the task's format. A
    gain is bounded by the room layer 0 left (R is at most 1): the subtracted verdict says
    which window gained more, the raw one which reads more at the layer. The family is the
    same either way: layers >= 1, both metrics, every task."""
    if subtract_format:
        lifted = format_subtracted(table, ["task", "model_seed"])
        diffs = paired_differences(lifted, ["task", "model_seed"])
    else:
        diffs = paired_differences(table, ["task", "model_seed", "seed"])
    return init_claims.probe_claims(diffs, model="model_seed", group="task")


def trained_comparison(docs: Mapping[str, Mapping], tasks: Sequence[str],
                       subtract_format: bool = False) -> pd.DataFrame:
    """The probe claim on the committed study's models of ``tasks`` (``committed_probes``),
    per task and layer (``compare_trained``): on raw values (default), or with
    ``subtract_format`` on each layer minus the same model's layer 0, the probes chapter's
    trained verdict."""
    return compare_trained(committed_probes(docs, tasks), subtract_format)


def trained_study(task: str, seed: int, prof: TrainProfile, fit_tokens: int, w: int,
                  probe_seeds: list[int], model: GPT, config: RidgeConfig,
                  shuffle: bool = False) -> pd.DataFrame:
    """Probe table of one trained model (the run of ``task`` and ``seed`` under ``prof``)
    on its own held-out test sequences (``task_sequences``: the same number of fitting tokens
    for every task), window ``w``, every layer and feature set, one fit per probe seed; with
    ``shuffle``, the shuffled-target control at layer 1 instead."""
    ids, lengths = task_sequences(task, seed, prof, fit_tokens, w, config)  # [n, T], [n]
    return probe_model(model, ids, [w], seeds=probe_seeds, config=config,
                       lengths=lengths, layers=[1] if shuffle else None,
                       shuffle_targets=shuffle)


def committed_probes(docs: Mapping[str, Mapping], tasks: Sequence[str],
                     shuffled: bool = False) -> pd.DataFrame:
    """The position probes the trained-model study committed for every run of ``tasks``
    (``docs``: ``trained_files.load_study``'s files), one row per (task, model seed, layer, feature
    set, probe seed) with nrmse, r and the window w; ``shuffled``: the shuffled-target
    control's rows instead."""
    rows = [{"task": task, "model_seed": run["seed"], "w": run["probes"]["w"], **row}
            for task in tasks for run in docs[task]["runs"]
            for row in run["probes"]["shuffled" if shuffled else "rows"]]
    if not rows:
        raise ValueError(f"no committed probes for tasks {list(tasks)}")
    return pd.DataFrame(rows)


LAYER_VERDICTS = ("cosine", "variance", "cannot tell")


def verdict_layers(comp: pd.DataFrame) -> str:
    """Markdown: the layers of ``init_claims.probe_claims``'s table (one group, indexed by layer)
    at each verdict, e.g. "**cosine** at layers 1, 2; **variance** at layers none; ..."."""
    by_verdict = {v: list(comp.index[comp.verdict == v]) for v in LAYER_VERDICTS}
    return "; ".join(f"**{v}** at layers {', '.join(map(str, ls)) or 'none'}"
                     for v, ls in by_verdict.items())


def with_interval(ci: pd.DataFrame) -> pd.DataFrame:
    """``metric_intervals``'s table as text, "mean [lo, hi]" per metric (nrmse, r), with the
    same index."""
    return pd.DataFrame({m: [f"{a:.3f} [{lo:.3f}, {hi:.3f}]"
                             for a, lo, hi in ci[[m, f"{m} lo", f"{m} hi"]].to_numpy()]
                         for m in ("nrmse", "r")}, index=ci.index)


# a trained run's probes, as the trained study records them (trained_study.run_record)
PROBE_W = 4  # the probes' window: features per position (addition's sequences are short)
PROBE_SEEDS = (0, 1, 2)  # probe seeds (split, random units) per trained model
PROBE_FIT_TOKENS = 8_000  # probed tokens in each fitting split, the same for every task
PROBE_COLUMNS = ("layer", "features", "seed", "nrmse", "r")


def probe_record(run: TrainedRun, fit_tokens: int = PROBE_FIT_TOKENS,
                 config: RidgeConfig = RidgeConfig()) -> dict:
    """The probes chapter's comparison on one trained model: every layer and feature set,
    each probe seed, on the run's own held-out test sequences; and the shuffled-target control
    at layer 1 (first probe seed)."""
    task, seed, model = run.metrics["task"], run.metrics["seed"], run.model
    args = (task, seed, run.profile, fit_tokens, PROBE_W)
    table = trained_study(*args, list(PROBE_SEEDS), model, config)
    control = trained_study(*args, list(PROBE_SEEDS[:1]), model, config, shuffle=True)
    ids, _ = task_sequences(task, seed, run.profile, fit_tokens, PROBE_W, config)

    def rows(frame: pd.DataFrame) -> list[dict]:
        return [{k: (v if isinstance(v, str) else float(v) if k in ("nrmse", "r") else int(v))
                 for k, v in row.items()} for row in frame[list(PROBE_COLUMNS)].to_dict("records")]

    return {"w": PROBE_W, "fit_tokens": fit_tokens, "n_sequences": len(ids),
            "probe_seeds": list(PROBE_SEEDS), "rows": rows(table), "shuffled": rows(control)}
