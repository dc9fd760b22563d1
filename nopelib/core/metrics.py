"""Metrics of the paper: self-cosine similarity, the adjacency score, variance, NRMSE, Pearson R.

The adjacency score of row k (0-based, k >= 2) of a similarity matrix C is the fraction of the
C(k, 2) pairs of earlier positions i < j < k with C[k, i] < C[k, j] (strictly: ties count as
not in order), i.e. "the nearer of two earlier positions is the more similar". It is the number
of strictly ascending pairs of the sequence C[k, 0], ..., C[k, k-1] divided by the number of
pairs: an inversion count, computed here by a merge sort in O(k log k) per row, so a whole
T x T matrix costs O(T^2 log T) time and O(T) extra memory per thread.

``layer_scores`` applies the score to every layer of a model on task inputs: the one reading
the chapters, the studies and a training run's trajectory share.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numba
import numpy as np
import torch

from nopelib.core.model import GPT
from nopelib.core.tasks import encode_inputs

ArrayLike = np.ndarray | torch.Tensor


def cosine_similarity_matrix(h: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """Self-cosine similarity of the rows of h: [..., T, d] -> [..., T, T].

    C[..., i, j] = h_i . h_j / (|h_i| |h_j|); a zero row gives zero similarities.
    """
    if h.dim() < 2 or 0 in h.shape:
        raise ValueError(f"h must have shape [..., T, d] with no empty dimension (T, d and "
                         f"every batch size >= 1); got {tuple(h.shape)}")
    unit = h / h.norm(dim=-1, keepdim=True).clamp_min(eps)
    C = unit @ unit.transpose(-2, -1)  # [..., T, T]
    # Identical rows (a repeated token at layer 0) must give identical similarities, so the
    # metric's ties are exact: a matrix product may round two equal columns differently,
    # depending on the CPU's kernels. Each row's columns and row are copied from the first
    # row equal to it, found by an exact integer hash of its bits.
    first = _first_equal_row(unit)  # [..., T]
    if bool((first != torch.arange(first.shape[-1])).any()):  # some row repeats another
        C = C.gather(-1, first.unsqueeze(-2).expand_as(C))
        C = C.gather(-2, first.unsqueeze(-1).expand_as(C))
    return C


# odd multipliers below 2**20: a hash of 32-bit words that cannot overflow int64 for rows of
# up to 2**11 words per multiplier cycle (2**31 * 2**20 * 2**11 = 2**62)
_HASH = torch.randint(0, 2**19, (1 << 11,), generator=torch.Generator().manual_seed(0)) * 2 + 1


def _first_equal_row(x: torch.Tensor) -> torch.Tensor:
    """For each row of x [..., T, d], the index of the first row with the same bits (itself
    if no earlier row has them), from an integer hash of the bits: exact, and the same on
    every CPU, since integer sums do not depend on the order they are added in."""
    if x.dtype not in (torch.float32, torch.float64):
        x = x.float()
    words = x.contiguous().view(torch.int32).to(torch.int64)  # [..., T, d or 2d]
    n = words.shape[-1]
    key = torch.zeros(words.shape[:-1], dtype=torch.int64)
    for lo in range(0, n, len(_HASH)):  # chunks keep every partial sum below 2**63
        chunk = words[..., lo:lo + len(_HASH)]
        key = key ^ (chunk * _HASH[:chunk.shape[-1]]).sum(-1)
    same = key.unsqueeze(-1) == key.unsqueeze(-2)  # [..., T, T]
    return same.int().argmax(-1)  # the first True of each row


def embedding_variance(h: ArrayLike) -> ArrayLike:
    """Chi et al.'s variance feature: the (population) variance of each hidden-state vector
    across its d feature dimensions. [..., T, d] -> [..., T]."""
    if isinstance(h, torch.Tensor):
        return h.var(dim=-1, unbiased=False)
    return np.asarray(h).var(axis=-1)


# Blocks of this many elements are insertion-sorted and counted directly before merging.
_BASE = 8


@numba.njit(cache=True, nogil=True)
def _ascending_pairs(values: np.ndarray, a: np.ndarray, b: np.ndarray) -> int:
    """Number of pairs i < j with values[i] < values[j]; a and b are scratch of the same length.

    Bottom-up merge sort: when two sorted runs merge, each element of the right run is paired
    with the left-run elements (all earlier in the original order) that are strictly smaller,
    and those are exactly the left elements already emitted when it is taken.
    """
    n = values.shape[0]
    count = 0
    for lo in range(0, n, _BASE):
        hi = min(lo + _BASE, n)
        for j in range(lo, hi):
            v = values[j]
            for i in range(lo, j):
                if values[i] < v:
                    count += 1
            p = j  # insert v into the sorted a[lo:j]
            while p > lo and a[p - 1] > v:
                a[p] = a[p - 1]
                p -= 1
            a[p] = v
    src, dst = a, b
    width = _BASE
    while width < n:
        for lo in range(0, n, 2 * width):
            mid = min(lo + width, n)
            hi = min(lo + 2 * width, n)
            i, j, o = lo, mid, lo
            while i < mid and j < hi:  # branch-free merge step
                x = src[i]
                y = src[j]
                left = x < y  # ties take the right element first: a tie is not "in order"
                dst[o] = x if left else y
                count += 0 if left else i - lo
                i += left
                j += 1 - left
                o += 1
            while i < mid:
                dst[o] = src[i]
                i += 1
                o += 1
            while j < hi:
                count += mid - lo
                dst[o] = src[j]
                j += 1
                o += 1
        src, dst = dst, src
        width *= 2
    return count


@numba.njit(cache=True, parallel=True)
def _row_scores(C: np.ndarray) -> np.ndarray:
    """C: [M, T, T] -> [M, T] row scores, NaN for rows 0 and 1."""
    M, T = C.shape[0], C.shape[1]
    out = np.full((M, T), np.nan)
    n_rows = M * (T - 2) if T > 2 else 0
    for task in numba.prange(n_rows):
        m = task % M
        r = task // M
        # zig-zag over rows (2, T-1, 3, T-2, ...): row k costs k log k, and this order gives
        # every thread of the static split the same work
        k = 2 + r // 2 if r % 2 == 0 else T - 1 - r // 2
        a = np.empty(k, dtype=C.dtype)
        b = np.empty(k, dtype=C.dtype)
        out[m, k] = _ascending_pairs(C[m, k, :k], a, b) / (k * (k - 1) // 2)
    return out


def _as_matrices(C: ArrayLike) -> np.ndarray:
    arr = C.detach().cpu().numpy() if isinstance(C, torch.Tensor) else np.asarray(C)
    if arr.ndim < 2 or arr.shape[-1] != arr.shape[-2]:
        raise ValueError(f"C must have shape [..., T, T]; got {arr.shape}")
    if arr.shape[-1] < 3:
        raise ValueError(f"C must have T >= 3 (rows k >= 2 have earlier pairs); got T={arr.shape[-1]}")
    if not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)
            or arr.dtype == np.bool_):
        raise ValueError(f"C must hold real numbers; got dtype {arr.dtype}")
    if arr.dtype not in (np.float32, np.float64):
        arr = arr.astype(np.float64)
    if not np.isfinite(arr).all():
        # a NaN compares as "not in order" with everything, so it would pass as a low score
        bad = int((~np.isfinite(arr)).sum())
        raise ValueError(f"C holds {bad} non-finite value(s) (NaN or inf); scores need finite C")
    return arr


def adjacency_row_scores(C: ArrayLike) -> np.ndarray:
    """Per-row adjacency scores: [..., T, T] -> [..., T], NaN for rows k = 0 and 1."""
    arr = _as_matrices(C)
    T = arr.shape[-1]
    flat = np.ascontiguousarray(arr.reshape(-1, T, T))
    # numba's OpenMP layer sets the process's OpenMP thread count when it starts, which is
    # torch's too: a run scored along its training would go on training on every core, with
    # other bits than the same run unscored. So torch's count is put back.
    threads = torch.get_num_threads()
    try:
        return _row_scores(flat).reshape(arr.shape[:-1])
    finally:
        torch.set_num_threads(threads)


def adjacency_score(C: ArrayLike) -> np.ndarray:
    """Adjacency probability score of each matrix: [..., T, T] -> [...] (a 0-d array for one
    matrix). The mean of the row scores over rows k >= 2; 0.5 is random, 1.0 a perfect pattern."""
    return np.nanmean(adjacency_row_scores(C), axis=-1)


def adjacency_score_reference(C: ArrayLike) -> np.ndarray:
    """The definition as a plain loop, O(T^3): for tests and as the benchmark's reference."""
    arr = _as_matrices(C)
    T = arr.shape[-1]
    flat = arr.reshape(-1, T, T)
    scores = np.empty(len(flat))
    for m, mat in enumerate(flat):
        rows = []
        for k in range(2, T):
            ordered = sum(mat[k, i] < mat[k, j] for j in range(k) for i in range(j))
            rows.append(ordered / (k * (k - 1) / 2))
        scores[m] = np.mean(rows)
    return scores.reshape(arr.shape[:-2])


def _real_pair(pred: ArrayLike, true: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """pred and true as flat float64 arrays; complex or non-finite values raise ValueError."""
    out = []
    for name, x in (("pred", pred), ("true", true)):
        arr = np.asarray(x.detach().cpu() if isinstance(x, torch.Tensor) else x)
        if np.iscomplexobj(arr) or arr.dtype == object:
            raise ValueError(f"{name} must hold real numbers; got dtype {arr.dtype}")
        arr = arr.astype(np.float64).ravel()
        if not np.isfinite(arr).all():
            raise ValueError(f"{name} holds non-finite values (NaN or inf)")
        out.append(arr)
    return out[0], out[1]


def nrmse(pred: ArrayLike, true: ArrayLike) -> float:
    """Root-mean-square error divided by the standard deviation of ``true``.

    With this normaliser, always predicting the mean position scores 1.0 and a perfect
    prediction 0.0, so values near 1 mean "no better than chance".
    """
    p, t = _real_pair(pred, true)
    if p.shape != t.shape or p.size == 0:
        raise ValueError(f"pred and true need the same non-zero size; got {p.size} and {t.size}")
    std = t.std()
    if std == 0:
        raise ValueError("true is constant; NRMSE is undefined")
    return float(np.sqrt(np.mean((p - t) ** 2)) / std)


def pearson_r(pred: ArrayLike, true: ArrayLike) -> float:
    """Pearson correlation of pred and true; 0.0 where pred is constant (no information)."""
    p, t = _real_pair(pred, true)
    if p.shape != t.shape or p.size < 2:
        raise ValueError(f"pred and true need the same size >= 2; got {p.size} and {t.size}")
    if p.std() == 0 or t.std() == 0:
        return 0.0
    return float(np.corrcoef(p, t)[0, 1])


# ---------------------------------------------------------------------------------------------
# a model's layers on task inputs


def length_groups(texts: Sequence[str]) -> dict[int, list[int]]:
    """{length T: indices of the texts of that length}, by increasing T; rejects T < 3, where no
    row has two earlier positions to compare."""
    groups: dict[int, list[int]] = defaultdict(list)
    for i, text in enumerate(texts):
        groups[len(text)].append(i)
    if groups and min(groups) < 3:
        raise ValueError(f"texts of length {min(groups)} have no row with two earlier positions; "
                         "need >= 3")
    return dict(sorted(groups.items()))


def adjacency_score_with_diagonal(C: np.ndarray | torch.Tensor) -> np.ndarray:
    """The score's other reading: rows 1-based, row k compares the C(k, 2) pairs among
    positions 1..k, the diagonal C_kk = 1 included: [..., T, T] -> [...].

    Padding C with a leading row and a trailing column shifts row k - 1 (0-based) with its
    diagonal into row k of a [T + 1, T + 1] matrix, whose usual score is this reading.
    """
    arr = C.detach().cpu().numpy() if isinstance(C, torch.Tensor) else np.asarray(C)
    if arr.ndim < 2 or arr.shape[-1] != arr.shape[-2]:
        raise ValueError(f"C must have shape [..., T, T]; got {arr.shape}")
    T = arr.shape[-1]
    padded = np.zeros(arr.shape[:-2] + (T + 1, T + 1), dtype=arr.dtype)  # [..., T+1, T+1]
    padded[..., 1:, :T] = arr  # the upper triangle is never read
    return adjacency_score(padded)


@torch.no_grad()
def layer_scores(model: GPT, texts: list[str], diagonal: bool = False) -> np.ndarray:
    """Adjacency score of every text at every layer: [len(texts), n_layer + 1].

    ``diagonal=True`` scores the diagonal-included reading (``adjacency_score_with_diagonal``).

    In a causal model the state at position i depends only on positions <= i, so right padding
    never reaches a text's own positions and one padded batch gives every text's states exactly
    (up to float rounding). A bidirectional model lets padding in, so its texts run in one batch
    per length.
    """
    device = next(model.parameters()).device
    groups = length_groups(texts)
    if model.config.causal:
        batches = [list(range(len(texts)))]
    else:
        batches = list(groups.values())
    scores = np.empty((len(texts), model.config.n_layer + 1))
    for batch in batches:
        idx, _ = encode_inputs([texts[i] for i in batch])  # [B, T_max], right-padded
        states = model.hidden_states(idx.to(device)).float().cpu()  # [L+1, B, T_max, d]
        row = {i: b for b, i in enumerate(batch)}
        for T, members in groups.items():
            rows = [row[i] for i in members if i in row]
            if rows:
                C = cosine_similarity_matrix(states[:, rows, :T])  # [L+1, b, T, T]
                score = adjacency_score_with_diagonal if diagonal else adjacency_score
                scores[[batch[r] for r in rows]] = score(C).T
    return scores
