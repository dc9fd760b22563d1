"""Probing position: can a small MLP read a token's position from its hidden-state features?

The paper compares two hypotheses for where a NoPE model keeps position: the *similarity* of
nearby hidden states (the adjacency pattern) and Chi et al.'s *variance* of the hidden state,
which shrinks like 1/position under uniform causal attention. Each hypothesis becomes a feature
set of the same size w for every probed position k:

- cosine window:   cos(h_k, h_{k-1}), ..., cos(h_k, h_{k-w})        (w numbers)
- variance window: var(h_k), var(h_{k-1}), ..., var(h_{k-w+1})      (w numbers)
- hidden state:    h_k itself                                       (d numbers, upper reference)

Only positions k >= w are probed, so every window is complete. Padding a short window would
leak k: the number of padded slots is w - k, and a constant pad value (or one drawn from another
distribution than the real slots) lets the probe count them. The diagonal cos(h_k, h_k) = 1 is
left out for the same reason as a row of a padded similarity matrix would be: its index is k.

Two probes read position from a feature set. The paper's is a 4-layer MLP (``ProbeConfig``:
three hidden layers of ``width`` GELU units and a linear output, trained full-batch with Adam on
the mean squared error of the standardised position, early-stopped on a validation split). The
default here is a random-feature ridge probe (``RidgeConfig``): the standardised features and
``n_random`` fixed random GELU units of them feed a ridge regression solved in closed form, with
the penalty chosen on the validation split, the closed-form counterpart of early stopping. It is
a one-hidden-layer network whose hidden layer is drawn instead of trained, so it can use ten
times the tokens of the MLP at a fraction of its cost.

Train, validation and test are split by sequence, never by token, because tokens of one sequence
share their history and would let a probe memorise a sequence instead of reading position.
Features are standardised with training-split statistics only. The studies the probes
chapter runs with this probe, and how their tables are judged, are ``nopelib.studies.probe_study``.
"""

from __future__ import annotations

import copy
import numbers
import os
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
import torch.nn as nn
import torch.nn.functional as F

from nopelib.core.features import FEATURE_SETS, features, model_states, window_positions
from nopelib.core.metrics import nrmse, pearson_r
from nopelib.core.model import GPT


@dataclass(frozen=True)
class ProbeConfig:
    """Probe architecture and training; the defaults fit a whole chapter into about a minute."""

    width: int = 32  # units in each of the three hidden layers
    lr: float = 1e-2  # Adam learning rate (full batch)
    max_steps: int = 300  # Adam steps at most
    eval_every: int = 10  # steps between validation checks
    patience: int = 4  # validation checks without improvement before stopping
    val_frac: float = 0.2  # fraction of the training sequences held out for early stopping
    test_frac: float = 0.3  # fraction of all sequences held out for the test metrics

    def __post_init__(self) -> None:
        for name in ("width", "max_steps", "eval_every", "patience"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive integer")
        if not self.lr > 0:
            raise ValueError(f"lr={self.lr!r} must be > 0")
        for name in ("val_frac", "test_frac"):
            value = getattr(self, name)
            if not 0.0 < value < 1.0:
                raise ValueError(f"{name}={value!r} must be in (0, 1)")


@dataclass(frozen=True)
class RidgeConfig:
    """The random-feature ridge probe: fixed random GELU units, penalty chosen on validation."""

    n_random: int = 256  # random GELU units added to the standardised features
    # ridge penalties tried, in units of the number of fitting tokens; the best on validation is kept
    penalties: tuple[float, ...] = (1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0)
    val_frac: float = 0.15  # fraction of the training sequences held out to choose the penalty
    test_frac: float = 0.2  # fraction of all sequences held out for the test metrics

    def __post_init__(self) -> None:
        if not isinstance(self.n_random, int) or isinstance(self.n_random, bool) \
                or self.n_random < 0:
            raise ValueError(f"n_random={self.n_random!r} must be an integer >= 0")
        if not self.penalties or not all(
                isinstance(p, numbers.Real) and p > 0 for p in self.penalties):
            raise ValueError(f"penalties={self.penalties!r} must be positive numbers (at least one)")
        for name in ("val_frac", "test_frac"):
            value = getattr(self, name)
            if not 0.0 < value < 1.0:
                raise ValueError(f"{name}={value!r} must be in (0, 1)")


@dataclass(frozen=True)
class ProbeResult:
    """Test-set outcome of one probe."""

    nrmse: float  # RMSE / std of the true test positions: 1.0 = predicting the mean
    r: float  # Pearson correlation of predicted and true test positions
    pred: np.ndarray  # predicted positions of the probed test tokens [n_test_tokens]
    true: np.ndarray  # true positions of the probed test tokens [n_test_tokens]
    test_sequences: np.ndarray  # indices of the test sequences
    train_sequences: np.ndarray  # indices of the sequences used for fitting and validation
    selected: float  # MLP: Adam step of the kept weights; ridge: the chosen penalty


def split_sequences(n_seq: int, frac: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint sorted index arrays (rest, held out) of ``n_seq`` sequences; ``frac`` held out."""
    if not 0.0 < frac < 1.0:
        raise ValueError(f"frac={frac!r} must be in (0, 1)")
    n_out = int(round(n_seq * frac))
    if n_out < 1 or n_out >= n_seq:
        raise ValueError(f"n_seq={n_seq} is too few to hold out frac={frac} and keep the rest")
    perm = np.random.default_rng(seed).permutation(n_seq)
    return np.sort(perm[n_out:]), np.sort(perm[:n_out])


@contextmanager
def _one_thread():
    """Run torch on one thread: matrices this small are fastest there, and a probe never
    oversubscribes a shared machine (two threads under load were 15-25x slower in our runs)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _mlp(n_in: int, width: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(n_in, width), nn.GELU(),
        nn.Linear(width, width), nn.GELU(),
        nn.Linear(width, width), nn.GELU(),
        nn.Linear(width, 1),
    )


def _token_splits(
    x: torch.Tensor, pos: np.ndarray, valid: np.ndarray, seed: int, val_frac: float,
    test_frac: float, shuffle_targets: bool,
) -> dict[str, object]:
    """Sequence-level fit/validation/test splits of the valid tokens, standardised with the
    training (fit + validation) statistics; targets standardised with the fit statistics."""
    N = x.shape[0]
    train_seq, test_seq = split_sequences(N, test_frac, seed)
    fit_local, val_local = split_sequences(len(train_seq), val_frac, seed + 1)
    fit_seq, val_seq = train_seq[fit_local], train_seq[val_local]
    y = torch.as_tensor(pos, dtype=torch.float32)  # [N, S]
    m = torch.as_tensor(valid)  # [N, S] bool
    parts = {}
    for name, seqs in (("fit", fit_seq), ("val", val_seq), ("test", test_seq)):
        keep = m[seqs]  # [n, S]
        parts[name] = (x[seqs][keep], y[seqs][keep])  # [n_tok, F], [n_tok]
        if len(parts[name][1]) < 2:
            raise ValueError(f"the {name} split holds {len(parts[name][1])} probed tokens; "
                             f"need more sequences or longer ones")
    (x_fit, y_fit), (x_val, y_val), (x_test, y_test) = parts["fit"], parts["val"], parts["test"]
    if shuffle_targets:
        g = torch.Generator().manual_seed(seed + 2)
        y_fit = y_fit[torch.randperm(len(y_fit), generator=g)]
        y_val = y_val[torch.randperm(len(y_val), generator=g)]
    train_x = torch.cat([x_fit, x_val])  # statistics of the training sequences only
    mu, sd = train_x.mean(0), train_x.std(0).clamp_min(1e-8)  # [F]
    y_mu, y_sd = y_fit.mean(), y_fit.std().clamp_min(1e-8)
    return dict(x_fit=(x_fit - mu) / sd, x_val=(x_val - mu) / sd, x_test=(x_test - mu) / sd,
                t_fit=(y_fit - y_mu) / y_sd, t_val=(y_val - y_mu) / y_sd, y_test=y_test,
                y_mu=y_mu, y_sd=y_sd, train_seq=train_seq, test_seq=test_seq)


def _fit_mlp(d: dict, seed: int, config: ProbeConfig) -> tuple[torch.Tensor, float]:
    """Standardised test predictions [n_test] of the early-stopped MLP and its kept step."""
    torch.manual_seed(seed)
    net = _mlp(d["x_fit"].shape[-1], config.width)
    opt = torch.optim.Adam(net.parameters(), lr=config.lr)
    best, best_state, best_step, bad = float("inf"), copy.deepcopy(net.state_dict()), 0, 0
    for step in range(1, config.max_steps + 1):
        loss = F.mse_loss(net(d["x_fit"]).squeeze(-1), d["t_fit"])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % config.eval_every == 0:
            with torch.no_grad():
                val = F.mse_loss(net(d["x_val"]).squeeze(-1), d["t_val"]).item()
            if val < best:
                best, best_state, best_step, bad = val, copy.deepcopy(net.state_dict()), step, 0
            else:
                bad += 1
                if bad >= config.patience:
                    break
    net.load_state_dict(best_state)
    with torch.no_grad():
        return net(d["x_test"]).squeeze(-1), float(best_step)


def _ridge_design(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The features and the random GELU units of them: [n, F] -> [n, F + n_random]."""
    return torch.cat([x, F.gelu(x @ w + b)], dim=-1)


def _fit_ridge(d: dict, seed: int, config: RidgeConfig) -> tuple[torch.Tensor, float]:
    """Standardised test predictions [n_test] of the ridge probe and its chosen penalty."""
    n_in = d["x_fit"].shape[-1]
    g = torch.Generator().manual_seed(seed)
    # unit-variance pre-activations for standardised inputs, offsets spread over the GELU bend
    w = torch.randn(n_in, config.n_random, generator=g) / n_in ** 0.5  # [F, m]
    b = torch.randn(config.n_random, generator=g)  # [m]
    phi_fit = _ridge_design(d["x_fit"], w, b)  # [n_fit, p]
    mu = phi_fit.mean(0)  # [p]
    sd = phi_fit.std(0).clamp_min(1e-8)  # [p]
    phi_fit = (phi_fit - mu) / sd
    phi_val = (_ridge_design(d["x_val"], w, b) - mu) / sd  # [n_val, p]
    phi_test = (_ridge_design(d["x_test"], w, b) - mu) / sd  # [n_test, p]
    t_fit = d["t_fit"] - d["t_fit"].mean()  # [n_fit] centred: the intercept is its mean
    gram = (phi_fit.T @ phi_fit).double()  # [p, p]
    evals, evecs = torch.linalg.eigh(gram)  # [p], [p, p]
    proj = evecs.T @ (phi_fit.T @ t_fit).double()  # [p]
    lam = torch.tensor(config.penalties, dtype=torch.float64) * len(t_fit)  # [n_pen]
    betas = evecs @ (proj[:, None] / (evals.clamp_min(0)[:, None] + lam[None, :]))  # [p, n_pen]
    betas = betas.float()
    offset = d["t_fit"].mean()
    val_mse = ((phi_val @ betas + offset - d["t_val"][:, None]) ** 2).mean(0)  # [n_pen]
    best = int(val_mse.argmin())
    return phi_test @ betas[:, best] + offset, float(config.penalties[best])


def fit_probe(
    feats: torch.Tensor | np.ndarray,
    positions: np.ndarray,
    seed: int = 0,
    config: ProbeConfig | RidgeConfig = RidgeConfig(),
    shuffle_targets: bool = False,
    valid: np.ndarray | None = None,
) -> ProbeResult:
    """Fit a probe on ``feats`` [N, S, F] (N sequences, S probed positions) to predict
    ``positions`` [S] (or [N, S]); return its test metrics.

    ``valid`` [N, S] (bool) marks the tokens that exist (sequences of different lengths); the
    others are neither fitted nor scored. ``seed`` fixes the split, the probe's randomness and
    (with ``shuffle_targets``) the permutation. ``shuffle_targets`` is the control: the training
    and validation targets are permuted across tokens, so no feature-target relation is left to
    learn; the test targets stay true. ``config`` picks the probe: ``RidgeConfig`` (default) or
    the paper's MLP, ``ProbeConfig``.
    """
    if not isinstance(config, (ProbeConfig, RidgeConfig)):
        raise ValueError(f"config={config!r} must be a ProbeConfig or a RidgeConfig")
    x = torch.as_tensor(feats, dtype=torch.float32)
    if x.dim() != 3:
        raise ValueError(f"feats must have shape [N, S, F]; got {tuple(x.shape)}")
    N, S, _ = x.shape
    pos = np.asarray(positions, dtype=np.float64)
    if pos.shape == (S,):
        pos = np.broadcast_to(pos, (N, S))
    if pos.shape != (N, S):
        raise ValueError(f"positions must have shape [S]=({S},) or [N, S]=({N}, {S}); "
                         f"got {pos.shape}")
    keep = np.ones((N, S), dtype=bool) if valid is None else np.asarray(valid)
    if keep.shape != (N, S) or keep.dtype != bool:
        raise ValueError(f"valid must be a bool array of shape [N, S]=({N}, {S}); "
                         f"got {keep.dtype} {keep.shape}")
    d = _token_splits(x, np.ascontiguousarray(pos), keep, seed, config.val_frac,
                      config.test_frac, shuffle_targets)
    with _one_thread(), torch.random.fork_rng(devices=[]), torch.no_grad():
        if isinstance(config, RidgeConfig):
            t_pred, selected = _fit_ridge(d, seed, config)
        else:
            with torch.enable_grad():
                t_pred, selected = _fit_mlp(d, seed, config)
    pred = (t_pred * d["y_sd"] + d["y_mu"]).numpy().astype(np.float64)  # [n_test]
    true = d["y_test"].numpy().astype(np.float64)
    return ProbeResult(nrmse(pred, true), pearson_r(pred, true), pred, true, d["test_seq"],
                       d["train_seq"], selected)


def probe_layers(
    states: torch.Tensor,
    w: int,
    seeds: list[int] | tuple[int, ...] = (0, 1, 2),
    kinds: tuple[str, ...] = FEATURE_SETS,
    layers: list[int] | None = None,
    config: ProbeConfig | RidgeConfig = RidgeConfig(),
    shuffle_targets: bool = False,
    lengths: np.ndarray | None = None,
) -> pd.DataFrame:
    """Probe every layer of ``states`` [L+1, N, T, d] with every feature set and probe seed.

    ``lengths`` [N] gives each sequence's real length (right padding after it is not probed).
    Returns one row per (layer, features, seed) with columns nrmse and r."""
    if states.dim() != 4:
        raise ValueError(f"states must have shape [L+1, N, T, d]; got {tuple(states.shape)}")
    positions = window_positions(states.shape[2], w)  # [S]
    valid = None
    if lengths is not None:
        lengths = np.asarray(lengths)
        if lengths.shape != (states.shape[1],):
            raise ValueError(f"lengths must have shape [N]=({states.shape[1]},); "
                             f"got {lengths.shape}")
        valid = positions[None, :] < lengths[:, None]  # [N, S]
    jobs = [(layer, kind) for layer in (layers if layers is not None
                                        else range(states.shape[0])) for kind in kinds]

    def fit(job: tuple[int, str]) -> list[dict]:
        layer, kind = job
        feats = features(states[layer], kind, w)  # [N, T-w, F]
        results = [(seed, fit_probe(feats, positions, seed, config, shuffle_targets, valid))
                   for seed in seeds]
        return [dict(layer=layer, features=kind, seed=seed, nrmse=res.nrmse, r=res.r)
                for seed, res in results]

    # Ridge fits run one per core, each on one thread: they draw only from their own
    # generators, so the rows are the same as one by one. The MLP probe initialises its
    # weights from torch's global generator, so its fits run one by one.
    workers = (os.cpu_count() or 1) if isinstance(config, RidgeConfig) else 1
    with _one_thread(), ThreadPoolExecutor(max(1, min(workers, len(jobs)))) as pool:
        rows = [row for rows in pool.map(fit, jobs) for row in rows]
    return pd.DataFrame(rows)


def probe_model(
    model: GPT,
    idx: torch.Tensor,
    windows: list[int] | tuple[int, ...],
    seeds: list[int] | tuple[int, ...] = (0,),
    kinds: tuple[str, ...] = FEATURE_SETS,
    layers: list[int] | None = None,
    config: ProbeConfig | RidgeConfig = RidgeConfig(),
    shuffle_targets: bool = False,
    lengths: np.ndarray | None = None,
) -> pd.DataFrame:
    """``probe_layers`` of ``model``'s states on ids [N, T], for every window in ``windows``
    from one forward pass; one row per (w, layer, features, seed). A whole study in one call,
    so ``nopelib.store.memo`` can skip the forward pass too."""
    if not windows:
        raise ValueError("windows must hold at least one window")
    states = model_states(model, idx)  # [L+1, N, T, d]
    return pd.concat([probe_layers(states, w, seeds, kinds, layers, config, shuffle_targets,
                                   lengths).assign(w=w) for w in windows], ignore_index=True)
