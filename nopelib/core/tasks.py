"""The four synthetic character-level tasks, one tokenizer, and dataset construction.

Every input ends with ``=``; the model then generates the answer followed by the end token.
Each task object can sample an (input, answer) pair and solve any well-formed input with an
oracle that parses the string, so the sampler and the oracle check each other.

Formats (the ordering format is ours; the paper does not give one):

==========  =============================  ==========  ==========================================
task        example                        answer      longest input
==========  =============================  ==========  ==========================================
addition    ``123+4567=``                  ``4690``    9: two numbers of 1-4 digits, 7 digits at most
reversal    ``rev(1234)=``                 ``4321``    22: 1-16 digits
indexing    ``wherex(134504392,4)=``       ``2``       20: 2-9 digits and a digit that occurs in them
ordering    ``perm(31825,82513)=``         ``23410``   18: 2-5 distinct digits and a permutation
==========  =============================  ==========  ==========================================

For ordering, the answer lists, for each element of the permutation, its 0-based index in the
original sequence: in ``perm(31825,82513)=`` the 8 stood at index 2, the 2 at 3, and so on.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

import torch

PAD = "<pad>"
EOS = "<eos>"
CHARS = "(),+=0123456789ehmprvwx"
VOCAB: list[str] = [PAD, EOS, *CHARS]
PAD_ID = 0
EOS_ID = 1
IGNORE_INDEX = -100  # targets that the loss skips (input and padding positions)
_CHAR_TO_ID = {c: i + 2 for i, c in enumerate(CHARS)}

DIGITS = "0123456789"


def encode(text: str) -> list[int]:
    """Character ids of ``text``; raises ValueError on a character outside the vocabulary."""
    try:
        return [_CHAR_TO_ID[c] for c in text]
    except KeyError as err:
        raise ValueError(
            f"text={text!r}: character {err.args[0]!r} is not in the vocabulary; allowed: {CHARS!r}"
        ) from None


def decode(ids: list[int]) -> str:
    """Characters of ``ids`` up to (not including) the first end token; padding is skipped."""
    out = []
    for i in ids:
        if not 0 <= i < len(VOCAB):
            raise ValueError(f"token id {i} is outside the vocabulary [0, {len(VOCAB)})")
        if i == EOS_ID:
            break
        if i != PAD_ID:
            out.append(VOCAB[i])
    return "".join(out)


def _number(rng: random.Random, n_digits: int) -> int:
    if n_digits == 1:
        return rng.randrange(10)
    return rng.randrange(10 ** (n_digits - 1), 10**n_digits)


def _digits(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(DIGITS) for _ in range(n))


class Task:
    """A task: ``sample`` draws an example, ``solve`` computes the answer of any valid input."""

    name: str
    max_input_len: int
    pattern: re.Pattern[str]

    def sample(self, rng: random.Random) -> tuple[str, str]:
        raise NotImplementedError

    def solve(self, text: str) -> str:
        raise NotImplementedError

    def _match(self, text: str) -> re.Match[str]:
        # ASCII: without it \d also matches other scripts' digits, which encode() rejects
        m = self.pattern.fullmatch(text) if text.isascii() else None
        if m is None:
            raise ValueError(f"{self.name}: input {text!r} does not match {self.pattern.pattern!r}")
        if len(text) > self.max_input_len:
            raise ValueError(
                f"{self.name}: input {text!r} has {len(text)} characters; at most {self.max_input_len}"
            )
        return m

    def __repr__(self) -> str:
        return f"<Task {self.name}>"


class Addition(Task):
    name = "addition"
    max_input_len = 9
    pattern = re.compile(r"(\d{1,4})\+(\d{1,4})=")

    def sample(self, rng: random.Random) -> tuple[str, str]:
        while True:
            la, lb = rng.randint(1, 4), rng.randint(1, 4)
            if la + lb <= 7:  # "a+b=" fits in 9 characters
                break
        a, b = _number(rng, la), _number(rng, lb)
        text = f"{a}+{b}="
        return text, str(a + b)

    def solve(self, text: str) -> str:
        a, b = self._match(text).groups()
        return str(int(a) + int(b))


class Reversal(Task):
    name = "reversal"
    max_input_len = 22
    pattern = re.compile(r"rev\((\d{1,16})\)=")

    def sample(self, rng: random.Random) -> tuple[str, str]:
        s = _digits(rng, rng.randint(1, 16))
        return f"rev({s})=", s[::-1]

    def solve(self, text: str) -> str:
        return self._match(text).group(1)[::-1]


class Indexing(Task):
    name = "indexing"
    max_input_len = 20
    pattern = re.compile(r"wherex\((\d{2,9}),(\d)\)=")

    def sample(self, rng: random.Random) -> tuple[str, str]:
        s = _digits(rng, rng.randint(2, 9))
        x = rng.choice(s)
        return f"wherex({s},{x})=", str(s.index(x))

    def solve(self, text: str) -> str:
        s, x = self._match(text).groups()
        if x not in s:
            raise ValueError(f"indexing: digit {x!r} does not occur in {s!r}")
        return str(s.index(x))


class Ordering(Task):
    name = "ordering"
    max_input_len = 18
    pattern = re.compile(r"perm\((\d{2,5}),(\d{2,5})\)=")

    def sample(self, rng: random.Random) -> tuple[str, str]:
        original = rng.sample(DIGITS, rng.randint(2, 5))
        shuffled = rng.sample(original, len(original))
        text = f"perm({''.join(original)},{''.join(shuffled)})="
        return text, "".join(str(original.index(c)) for c in shuffled)

    def solve(self, text: str) -> str:
        original, shuffled = self._match(text).groups()
        if len(set(original)) != len(original):
            raise ValueError(f"ordering: digits of {original!r} are not distinct")
        if sorted(original) != sorted(shuffled):
            raise ValueError(f"ordering: {shuffled!r} is not a permutation of {original!r}")
        return "".join(str(original.index(c)) for c in shuffled)


TASKS: dict[str, Task] = {t.name: t for t in (Addition(), Reversal(), Indexing(), Ordering())}


def get_task(name: str) -> Task:
    """The task called ``name``; raises ValueError naming the allowed names otherwise."""
    if name not in TASKS:
        raise ValueError(f"task={name!r} is unknown; allowed: {sorted(TASKS)}")
    return TASKS[name]


# The longest training sequence of any task: input, answer and end token.
# reversal: 22 + 16 + 1 = 39 tokens.
MAX_SEQ_LEN = 39


@dataclass(frozen=True)
class Split:
    """Disjoint train, test and validation examples of one task: lists of (input, answer)."""

    task: str
    seed: int
    train: list[tuple[str, str]]
    test: list[tuple[str, str]]
    val: list[tuple[str, str]] = field(default_factory=list)


# the most examples one split or sample holds: 50 times the paper's 20,000 + 20,000, and a
# bound on memory (the distinct inputs are kept in a dict while they are drawn)
MAX_EXAMPLES = 2_000_000


def make_split(task: str, seed: int = 0, n_train: int = 20_000, n_test: int = 20_000,
               n_val: int = 0) -> Split:
    """``n_train`` + ``n_test`` (+ ``n_val``) distinct examples of ``task``, identical for
    the same seed.

    Inputs are drawn until enough distinct ones exist; the first ``n_train`` in draw order form
    the training set, the next ``n_test`` the test set and the rest the validation set, so no
    input is in two of them, and asking for a validation set leaves train and test as they are.
    """
    t = get_task(task)
    for name, n in (("n_train", n_train), ("n_test", n_test), ("n_val", n_val)):
        if type(n) is not int or not 0 <= n <= MAX_EXAMPLES:
            raise ValueError(f"{name}={n!r} must be an integer in [0, {MAX_EXAMPLES:,}]")
    if n_train + n_test + n_val > MAX_EXAMPLES:
        raise ValueError(f"n_train + n_test + n_val = {n_train + n_test + n_val:,} must be at "
                         f"most {MAX_EXAMPLES:,}")
    rng = random.Random(f"{task}-{seed}")
    seen: dict[str, str] = {}
    need = n_train + n_test + n_val
    draws = 0
    while len(seen) < need:
        text, answer = t.sample(rng)
        seen.setdefault(text, answer)
        draws += 1
        if draws > 50 * need + 1000:
            raise RuntimeError(f"{task}: could not draw {need} distinct inputs")
    pairs = list(seen.items())
    return Split(task, seed, pairs[:n_train], pairs[n_train:n_train + n_test],
                 pairs[n_train + n_test:])


def encode_batch(
    pairs: list[tuple[str, str]], block_size: int = MAX_SEQ_LEN
) -> tuple[torch.Tensor, torch.Tensor]:
    """Training tensors for (input, answer) pairs, right-padded to the longest sequence.

    Returns ``idx`` [B, T] (input, answer, end token, padding) and ``targets`` [B, T] where
    ``targets[b, t]`` is the token that position t must predict, or IGNORE_INDEX where the loss
    skips it: only the answer and the end token are learned.
    """
    if not pairs:
        raise ValueError("pairs must hold at least one (input, answer) pair")
    seqs = []
    for text, answer in pairs:
        ids = encode(text) + encode(answer) + [EOS_ID]
        if len(ids) > block_size + 1:
            raise ValueError(
                f"example {text!r}->{answer!r} needs {len(ids) - 1} positions; block_size={block_size}"
            )
        seqs.append((ids, len(text)))
    T = max(len(ids) for ids, _ in seqs) - 1
    idx = torch.full((len(seqs), T), PAD_ID, dtype=torch.long)
    targets = torch.full((len(seqs), T), IGNORE_INDEX, dtype=torch.long)
    for b, (ids, n_in) in enumerate(seqs):
        ids_t = torch.tensor(ids)
        idx[b, : len(ids) - 1] = ids_t[:-1]
        # position t predicts ids[t + 1]; the answer starts after the input's last character
        targets[b, n_in - 1 : len(ids) - 1] = ids_t[n_in:]
    return idx, targets


def encode_inputs(texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids [B, T] of the inputs and their lengths [B].

    Right padding is safe under causal attention: padding comes after every real position.
    """
    if not texts:
        raise ValueError("texts must hold at least one input")
    ids = [encode(t) for t in texts]
    lengths = torch.tensor([len(i) for i in ids])
    idx = torch.full((len(ids), int(lengths.max())), PAD_ID, dtype=torch.long)
    for b, i in enumerate(ids):
        idx[b, : len(i)] = torch.tensor(i)
    return idx, lengths


def sample_inputs(task: str, n: int, seed: int = 0) -> list[str]:
    """``n`` task inputs (without answers), reproducible for the seed."""
    if type(n) is not int or not 0 <= n <= MAX_EXAMPLES:
        raise ValueError(f"n={n!r} must be an integer in [0, {MAX_EXAMPLES:,}]")
    rng = random.Random(f"inputs-{task}-{seed}")
    t = get_task(task)
    return [t.sample(rng)[0] for _ in range(n)]


def majority_baseline(pairs: list[tuple[str, str]]) -> tuple[str, float]:
    """The most frequent answer of ``pairs`` and its share: the exact match of a model that
    ignores its input and always gives that answer (the best any constant answer can do)."""
    if not pairs:
        raise ValueError("pairs must hold at least one (input, answer) pair")
    counts: dict[str, int] = {}
    for _, answer in pairs:
        counts[answer] = counts.get(answer, 0) + 1
    answer = max(counts, key=counts.get)
    return answer, counts[answer] / len(pairs)
