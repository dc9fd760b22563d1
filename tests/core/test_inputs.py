"""Values that cannot train or score are refused with ValueError naming them (issue 12)."""

from __future__ import annotations

import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

import nopelib
from nopelib.core.features import window_positions
from nopelib.core.metrics import adjacency_row_scores, adjacency_score, nrmse, pearson_r
from nopelib.core.model import GPT, VOCAB_SIZE, GPTConfig
from nopelib.core.tasks import VOCAB, encode_batch, encode_inputs, get_task
from nopelib.store import cache
from nopelib.training import profiles

SMALL = GPTConfig(n_layer=1, n_head=2, n_embd=16)


# --- metrics ----------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_adjacency_score_rejects_non_finite_matrices(bad):
    C = np.eye(6) + 0.1
    C[4, 1] = bad
    with pytest.raises(ValueError, match="non-finite"):
        adjacency_score(C)
    with pytest.raises(ValueError, match="non-finite"):
        adjacency_score(np.full((6, 6), math.nan))  # once scored 0.0
    with pytest.raises(ValueError, match="non-finite"):
        adjacency_row_scores(torch.full((2, 5, 5), math.nan))


def test_adjacency_score_rejects_complex_matrices():
    with pytest.raises(ValueError, match="real numbers.*complex"):
        adjacency_score(np.eye(5, dtype=np.complex128) * (1 + 1j))


def test_nrmse_and_pearson_reject_non_finite_or_complex_values():
    good = np.arange(5.0)
    for fn in (nrmse, pearson_r):
        with pytest.raises(ValueError, match="pred holds non-finite"):
            fn(np.array([0, 1, math.nan, 3, 4]), good)
        with pytest.raises(ValueError, match="true holds non-finite"):
            fn(good, np.array([0, 1, math.inf, 3, 4]))
        with pytest.raises(ValueError, match="real numbers"):
            fn(good + 1j, good)


# --- configs and profiles ---------------------------------------------------------------------

@pytest.mark.parametrize("field, value", [
    ("init_std", 1e39), ("init_std", 1e38), ("init_mean", 1e39), ("init_std", math.nan),
    ("causal", "no"), ("bias", 1), ("n_layer", True), ("n_embd", 16.0), ("dropout", "0.1"),
])
def test_gpt_config_rejects_values_that_cannot_train(field, value):
    with pytest.raises(ValueError, match=field):
        replace(SMALL, **{field: value})


@pytest.mark.parametrize("field, value", [
    ("lr", math.inf), ("lr", math.nan), ("lr", 1e39), ("lr", True), ("grad_clip", -1.0),
    ("grad_clip", 0.0), ("grad_clip", math.nan), ("weight_decay", math.nan), ("weight_decay", -0.1),
    ("min_lr_ratio", math.nan), ("steps", True), ("steps", 10.0), ("warmup_steps", 1.5),
    ("betas", (0.9, math.nan)), ("betas", (0.9,)), ("seeds", ()), ("seeds", (0, -1)),
    ("seeds", [0]),
])
def test_train_profile_rejects_values_that_cannot_train(field, value):
    with pytest.raises(ValueError, match=field):
        replace(profiles.PROFILES["cpu"], **{field: value})


def test_the_model_does_not_import_the_tasks_and_keeps_the_vocabulary_size():
    assert VOCAB_SIZE == len(VOCAB) == GPTConfig().vocab_size == 25
    code = "import sys, nopelib.core.model; print('nopelib.core.tasks' in sys.modules)"
    # import the module by path, without the package __init__ (which imports tasks for TASKS)
    root = Path(nopelib.__file__).resolve().parent.parent
    stub = ("import sys, types, importlib.util; pkg = types.ModuleType('nopelib'); "
            f"pkg.__path__ = [{str(root / 'nopelib')!r}]; sys.modules['nopelib'] = pkg; ")
    out = subprocess.run([sys.executable, "-c", stub + code.replace("import sys, ", "import ")],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --- model inputs -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bool])
def test_token_ids_must_be_integers(dtype):
    with pytest.raises(ValueError, match="integer token ids"):
        GPT(SMALL)(torch.zeros(1, 4, dtype=dtype))


def test_a_loss_over_no_targets_is_an_error_not_nan():
    idx = torch.zeros(2, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="all IGNORE_INDEX"):
        GPT(SMALL)(idx, torch.full((2, 4), -100))


# --- tasks and probes -------------------------------------------------------------------------

def test_empty_batches_are_refused_by_name():
    with pytest.raises(ValueError, match="pairs must hold"):
        encode_batch([])
    with pytest.raises(ValueError, match="texts must hold"):
        encode_inputs([])


def test_solve_rejects_non_ascii_digits_as_encode_does():
    with pytest.raises(ValueError, match="does not match"):
        get_task("addition").solve("\u0661\u0662+3=")  # Arabic-Indic digits
    with pytest.raises(ValueError, match="does not match"):
        get_task("reversal").solve("rev(\uff11\uff12)=")  # full-width digits


def test_probe_windows_accept_numpy_integers():
    assert window_positions(6, np.int64(2)).tolist() == [2, 3, 4, 5]
    with pytest.raises(ValueError, match="w=True"):
        window_positions(6, True)


def test_numba_caches_outside_the_package(tmp_path):
    import os
    import nopelib.store.cache as cache
    assert not Path(os.environ["NUMBA_CACHE_DIR"]).resolve().is_relative_to(cache.PACKAGE_DIR)
    assert not list(cache.PACKAGE_DIR.rglob("*.nbi"))
