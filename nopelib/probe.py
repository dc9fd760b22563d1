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

The probe is a 4-layer MLP (three hidden layers of ``width`` GELU units and a linear output),
trained full-batch with Adam on the mean squared error of the standardised position, with early
stopping on a validation split of the training *sequences*. Train, validation and test are split
by sequence, never by token, because tokens of one sequence share their history and would let a
probe memorise a sequence instead of reading position. Features are standardised with
training-split statistics only.
"""

from __future__ import annotations

import copy
import numbers
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
import torch.nn as nn
import torch.nn.functional as F

from nopelib.metrics import embedding_variance, nrmse, pearson_r
from nopelib.model import GPT
from nopelib.tasks import encode

FEATURE_SETS = ("cosine", "variance", "hidden")


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
class ProbeResult:
    """Test-set outcome of one probe."""

    nrmse: float  # RMSE / std of the true test positions: 1.0 = predicting the mean
    r: float  # Pearson correlation of predicted and true test positions
    pred: np.ndarray  # predicted positions of the test tokens [n_test_seq * S]
    true: np.ndarray  # true positions of the test tokens [n_test_seq * S]
    test_sequences: np.ndarray  # indices of the test sequences
    train_sequences: np.ndarray  # indices of the sequences used for fitting and validation
    steps: int  # Adam step of the kept (best-validation) weights


def _is_count(value: object) -> bool:
    """A positive integer of any integer type (numpy's too), but not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 1


def _check_window(states: torch.Tensor, w: int) -> None:
    if not _is_count(w):
        raise ValueError(f"w={w!r} must be a positive integer")
    if states.dim() < 3:
        raise ValueError(f"states must have shape [..., N, T, d]; got {tuple(states.shape)}")
    if states.shape[-2] <= w:
        raise ValueError(f"w={w} needs sequences longer than w; got T={states.shape[-2]}")


def window_positions(T: int, w: int) -> np.ndarray:
    """The probed positions of a length-T sequence with window w: k = w, ..., T - 1."""
    if not _is_count(w):
        raise ValueError(f"w={w!r} must be a positive integer")
    if T <= w:
        raise ValueError(f"T={T} must exceed w={w}")
    return np.arange(w, T)


def cosine_window_features(states: torch.Tensor, w: int) -> torch.Tensor:
    """cos(h_k, h_{k-j}) for j = 1..w at positions k = w..T-1:
    [..., N, T, d] -> [..., N, T-w, w]."""
    _check_window(states, w)
    T = states.shape[-2]
    unit = F.normalize(states.float(), dim=-1)  # [..., N, T, d]
    here = unit[..., w:, :]  # [..., N, T-w, d]
    # w x [..., N, T-w]
    cols = [(here * unit[..., w - j : T - j, :]).sum(-1) for j in range(1, w + 1)]
    return torch.stack(cols, dim=-1)  # [..., N, T-w, w]


def variance_window_features(states: torch.Tensor, w: int) -> torch.Tensor:
    """var(h_{k-j}) for j = 0..w-1 at positions k = w..T-1: [..., N, T, d] -> [..., N, T-w, w].

    The window includes position k itself (Chi et al.'s feature for k), then its w-1
    predecessors, so it has as many inputs as the cosine window."""
    _check_window(states, w)
    T = states.shape[-2]
    var = embedding_variance(states.float())  # [..., N, T]
    cols = [var[..., w - j : T - j] for j in range(w)]  # w x [..., N, T-w]
    return torch.stack(cols, dim=-1)  # [..., N, T-w, w]


def hidden_features(states: torch.Tensor, w: int) -> torch.Tensor:
    """The hidden state h_k at the same positions k = w..T-1: [..., N, T, d] -> [..., N, T-w, d]."""
    _check_window(states, w)
    return states[..., w:, :].float()


def features(states: torch.Tensor, kind: str, w: int) -> torch.Tensor:
    """The feature set ``kind`` (one of FEATURE_SETS) at positions w..T-1: [..., N, T-w, F]."""
    fns = {"cosine": cosine_window_features, "variance": variance_window_features,
           "hidden": hidden_features}
    if kind not in fns:
        raise ValueError(f"kind={kind!r} is unknown; allowed: {FEATURE_SETS}")
    return fns[kind](states, w)


def random_token_sequences(n: int, T: int, alphabet: str, seed: int = 0) -> torch.Tensor:
    """``n`` sequences of ``T`` characters drawn i.i.d. uniformly from ``alphabet``: ids [n, T].

    Token identity is independent of position here, so any position a probe reads must come
    from the model's computation, not from the input's format."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n={n!r} must be a positive integer")
    if not isinstance(T, int) or T < 1:
        raise ValueError(f"T={T!r} must be a positive integer")
    if not alphabet:
        raise ValueError(f"alphabet={alphabet!r} must hold at least one character")
    ids = torch.tensor(encode("".join(sorted(set(alphabet)))))
    g = torch.Generator().manual_seed(seed)
    return ids[torch.randint(len(ids), (n, T), generator=g)]  # [n, T]


@torch.no_grad()
def model_states(model: GPT, idx: torch.Tensor, batch: int = 256) -> torch.Tensor:
    """Residual stream of every layer for ids [N, T]: [n_layer + 1, N, T, d] (float32, CPU)."""
    parts = [model.hidden_states(idx[i : i + batch]).float().cpu()
             for i in range(0, len(idx), batch)]
    return torch.cat(parts, dim=1)


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


def fit_probe(
    feats: torch.Tensor | np.ndarray,
    positions: np.ndarray,
    seed: int = 0,
    config: ProbeConfig = ProbeConfig(),
    shuffle_targets: bool = False,
) -> ProbeResult:
    """Train a probe on ``feats`` [N, S, F] (N sequences, S probed positions) to predict
    ``positions`` [S] (or [N, S]); return its test metrics.

    ``seed`` fixes the split, the initialisation and (with ``shuffle_targets``) the permutation.
    ``shuffle_targets`` is the control: the training and validation targets are permuted across
    tokens, so no feature-target relation is left to learn; the test targets stay true.
    """
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
    y = torch.as_tensor(np.ascontiguousarray(pos), dtype=torch.float32)  # [N, S]

    train_seq, test_seq = split_sequences(N, config.test_frac, seed)
    fit_local, val_local = split_sequences(len(train_seq), config.val_frac, seed + 1)
    fit_seq, val_seq = train_seq[fit_local], train_seq[val_local]

    # [n*S, F] each
    x_fit, x_val, x_test = (x[s].reshape(-1, x.shape[-1]) for s in (fit_seq, val_seq, test_seq))
    y_fit, y_val, y_test = (y[s].reshape(-1) for s in (fit_seq, val_seq, test_seq))  # [n*S]
    if shuffle_targets:
        g = torch.Generator().manual_seed(seed + 2)
        y_fit = y_fit[torch.randperm(len(y_fit), generator=g)]
        y_val = y_val[torch.randperm(len(y_val), generator=g)]

    train_x = torch.cat([x_fit, x_val])  # statistics of the training sequences only
    mu, sd = train_x.mean(0), train_x.std(0).clamp_min(1e-8)  # [F]
    y_mu, y_sd = y_fit.mean(), y_fit.std().clamp_min(1e-8)
    x_fit, x_val, x_test = ((t - mu) / sd for t in (x_fit, x_val, x_test))
    t_fit, t_val = (y_fit - y_mu) / y_sd, (y_val - y_mu) / y_sd

    with _one_thread(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = _mlp(x.shape[-1], config.width)
        opt = torch.optim.Adam(net.parameters(), lr=config.lr)
        best, best_state, best_step, bad = float("inf"), copy.deepcopy(net.state_dict()), 0, 0
        for step in range(1, config.max_steps + 1):
            loss = F.mse_loss(net(x_fit).squeeze(-1), t_fit)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if step % config.eval_every == 0:
                with torch.no_grad():
                    val = F.mse_loss(net(x_val).squeeze(-1), t_val).item()
                if val < best:
                    best, best_state, best_step, bad = val, copy.deepcopy(net.state_dict()), step, 0
                else:
                    bad += 1
                    if bad >= config.patience:
                        break
        net.load_state_dict(best_state)
        with torch.no_grad():
            pred = (net(x_test).squeeze(-1) * y_sd + y_mu).numpy().astype(np.float64)  # [n_test*S]
    true = y_test.numpy().astype(np.float64)
    return ProbeResult(nrmse(pred, true), pearson_r(pred, true), pred, true, test_seq, train_seq,
                       best_step)


def probe_layers(
    states: torch.Tensor,
    w: int,
    seeds: list[int] | tuple[int, ...] = (0, 1, 2),
    kinds: tuple[str, ...] = FEATURE_SETS,
    layers: list[int] | None = None,
    config: ProbeConfig = ProbeConfig(),
    shuffle_targets: bool = False,
) -> pd.DataFrame:
    """Probe every layer of ``states`` [L+1, N, T, d] with every feature set and probe seed.

    Returns one row per (layer, features, seed) with columns nrmse and r."""
    if states.dim() != 4:
        raise ValueError(f"states must have shape [L+1, N, T, d]; got {tuple(states.shape)}")
    positions = window_positions(states.shape[2], w)
    rows = []
    for layer in layers if layers is not None else range(states.shape[0]):
        for kind in kinds:
            feats = features(states[layer], kind, w)  # [N, T-w, F]
            for seed in seeds:
                res = fit_probe(feats, positions, seed, config, shuffle_targets)
                rows.append(dict(layer=layer, features=kind, seed=seed, nrmse=res.nrmse, r=res.r))
    return pd.DataFrame(rows)


def summary(table: pd.DataFrame) -> pd.DataFrame:
    """Mean and sample std over seeds of NRMSE and R: one row per layer, columns per feature set."""
    stats = table.groupby(["layer", "features"])[["nrmse", "r"]].agg(["mean", "std"])
    return stats.unstack("features")


def compare_features(table: pd.DataFrame) -> pd.DataFrame:
    """Mean NRMSE and R of the cosine and the variance probes per layer, and whether cosine wins
    on both: the paper's claim against Chi et al.'s variance hypothesis, layer by layer."""
    m = table.groupby(["layer", "features"])[["nrmse", "r"]].mean().unstack("features")
    out = pd.DataFrame({"nrmse cosine": m[("nrmse", "cosine")],
                        "nrmse variance": m[("nrmse", "variance")],
                        "R cosine": m[("r", "cosine")], "R variance": m[("r", "variance")]})
    out["cosine wins"] = ((out["nrmse cosine"] < out["nrmse variance"])
                          & (out["R cosine"] > out["R variance"]))
    return out
