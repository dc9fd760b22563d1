"""Exact-match evaluation: greedy decoding, scored on the whole answer and its end token.

``evaluate`` computes it with one teacher-forced pass per batch; ``greedy_accuracy`` decodes
token by token, as the reference it is tested against.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from nopelib.core.model import GPT
from nopelib.core.tasks import EOS_ID, IGNORE_INDEX, encode, encode_batch, encode_inputs


@torch.no_grad()
def evaluate(model: GPT, pairs: list[tuple[str, str]], batch_size: int = 500) -> float:
    """Exact-match accuracy of greedy decoding: the fraction of (input, answer) pairs for which
    greedy decoding after the input produces exactly the answer followed by the end token.

    Computed with one teacher-forced forward pass per batch instead of one pass per generated
    token. The two are the same test: greedy decoding reproduces answer + end token if and only
    if, at every answer position, the argmax of the logits given the true prefix is the true
    next token (up to the first mismatch, greedy decoding has seen exactly the true prefix).
    Rows are right-padded, and in a causal model padding never reaches earlier positions.
    """
    if not pairs:
        raise ValueError("pairs must hold at least one (input, answer) pair")
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} must be a positive integer")
    if not model.config.causal:
        raise ValueError("evaluate needs a causal model (config.causal=True): teacher forcing "
                         "equals greedy decoding only when no position sees later ones")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    # batches of similar lengths pad less; the count of exact matches does not depend on order
    pairs = sorted(pairs, key=lambda pair: len(pair[0]) + len(pair[1]))
    correct = 0
    for lo in range(0, len(pairs), batch_size):
        idx, targets = encode_batch(pairs[lo:lo + batch_size], block_size=model.config.block_size)  # [b, T]
        logits, _ = model(idx.to(device))  # [b, T, vocab]
        hit = logits.argmax(-1).cpu() == targets  # [b, T]
        scored = targets != IGNORE_INDEX  # the answer tokens and the end token
        correct += int((hit | ~scored).all(dim=1).sum())
    model.train(was_training)
    return correct / len(pairs)


@torch.no_grad()
def greedy_accuracy(model: GPT, pairs: list[tuple[str, str]], batch_size: int = 500) -> float:
    """The reference for ``evaluate``: exact match by decoding token by token.

    Inputs are grouped by length (no padding enters the model); each batch feeds back its own
    argmax one token at a time and stops once every row has produced the end token. One forward
    pass per generated token, so ``evaluate`` gives the same number many times faster; the tests
    and the benchmark compare the two.
    """
    if not pairs:
        raise ValueError("pairs must hold at least one (input, answer) pair")
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} must be a positive integer")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    groups: dict[int, list[int]] = defaultdict(list)
    for i, (text, _) in enumerate(pairs):
        groups[len(text)].append(i)
    correct = 0
    for members in groups.values():
        for lo in range(0, len(members), batch_size):
            chunk = [pairs[i] for i in members[lo:lo + batch_size]]
            idx, _ = encode_inputs([text for text, _ in chunk])  # [b, T], all rows length T
            idx = idx.to(device)
            expected = [encode(answer) + [EOS_ID] for _, answer in chunk]
            n_new = min(max(len(e) for e in expected), model.config.block_size - idx.shape[1])
            done = torch.zeros(idx.shape[0], dtype=torch.bool, device=device)
            out = []
            for _ in range(n_new):
                logits, _ = model(idx)
                nxt = logits[:, -1].argmax(-1)  # [b]
                out.append(nxt)
                idx = torch.cat([idx, nxt[:, None]], dim=1)
                done |= nxt == EOS_ID
                if bool(done.all()):
                    break
            generated = torch.stack(out, dim=1).cpu().tolist()  # [b, generated]
            correct += sum(g[:len(e)] == e for g, e in zip(generated, expected))
    model.train(was_training)
    return correct / len(pairs)
