"""The four tasks: sampler against oracle, length limits, tokenizer, dataset splits."""

from __future__ import annotations

import random

import pytest
import torch

from nopelib.core.tasks import (EOS_ID, IGNORE_INDEX, MAX_SEQ_LEN, TASKS, decode, encode,
                                encode_batch, encode_inputs, get_task, make_split, sample_inputs)

LIMITS = {"addition": 9, "reversal": 22, "indexing": 20, "ordering": 18}


@pytest.mark.parametrize("name", sorted(TASKS))
def test_oracle_agrees_with_sampler(name: str) -> None:
    task = TASKS[name]
    assert task.max_input_len == LIMITS[name]
    rng = random.Random(0)
    lengths = set()
    for _ in range(3000):
        text, answer = task.sample(rng)
        assert text.endswith("=") and len(text) <= task.max_input_len
        assert task.solve(text) == answer
        assert len(encode(text) + encode(answer)) + 1 <= MAX_SEQ_LEN + 1
        lengths.add(len(text))
    assert max(lengths) == task.max_input_len  # the longest format is actually produced


def test_answers_by_hand() -> None:
    assert TASKS["addition"].solve("123+456=") == "579"
    assert TASKS["reversal"].solve("rev(1234)=") == "4321"
    assert TASKS["indexing"].solve("wherex(134504392,4)=") == "2"
    assert TASKS["ordering"].solve("perm(31825,82513)=") == "23410"


@pytest.mark.parametrize(
    "name, text, message",
    [
        ("addition", "12+=", "does not match"),
        ("addition", "12345+1=", "does not match"),
        ("addition", "1234+123", "does not match"),
        ("reversal", "rev(12a)=", "does not match"),
        ("indexing", "wherex(12345,9)=", "does not occur"),
        ("ordering", "perm(112,121)=", "not distinct"),
        ("ordering", "perm(123,124)=", "not a permutation"),
    ],
)
def test_malformed_inputs_raise(name: str, text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TASKS[name].solve(text)


def test_unknown_task() -> None:
    with pytest.raises(ValueError, match=r"task='multiply' is unknown; allowed: \['addition'"):
        get_task("multiply")
    with pytest.raises(ValueError, match="task='sorting'"):
        make_split("sorting")


@pytest.mark.parametrize("name", sorted(TASKS))
def test_splits_are_disjoint_reproducible_and_full_size(name: str) -> None:
    a, b = make_split(name, seed=3), make_split(name, seed=3)
    assert len(a.train) == len(a.test) == 20_000
    assert a.train == b.train and a.test == b.test
    assert not {t for t, _ in a.train} & {t for t, _ in a.test}
    assert make_split(name, seed=4).train != a.train


def test_tokenizer_round_trip_and_errors() -> None:
    text = "wherex(134504392,4)="
    assert decode(encode(text)) == text
    assert decode(encode("12") + [EOS_ID] + encode("34")) == "12"
    with pytest.raises(ValueError, match="character 'z' is not in the vocabulary"):
        encode("z+1=")
    with pytest.raises(ValueError, match="token id 99"):
        decode([99])


def test_encode_batch_targets_only_the_answer() -> None:
    pairs = [("1+2=", "3"), ("rev(123)=", "321")]
    idx, targets = encode_batch(pairs)
    assert idx.shape == targets.shape == (2, len("rev(123)=321"))
    for (text, answer), row, tgt in zip(pairs, idx, targets):
        learned = tgt[tgt != IGNORE_INDEX].tolist()
        assert learned == encode(answer) + [EOS_ID]
        first = len(text) - 1  # the '=' position predicts the first answer character
        assert tgt[first].item() == encode(answer)[0] and (tgt[:first] == IGNORE_INDEX).all()
        assert decode(row[: len(text)].tolist()) == text
    with pytest.raises(ValueError, match="block_size=5"):
        encode_batch(pairs, block_size=5)


def test_encode_inputs_pads_right() -> None:
    idx, lengths = encode_inputs(["1+2=", "rev(1)="])
    assert lengths.tolist() == [4, 7]
    assert (idx[0, 4:] == 0).all() and torch.equal(idx[1], torch.tensor(encode("rev(1)=")))


@pytest.mark.parametrize("kwargs, name", [
    (dict(n_train=10**9), "n_train"), (dict(n_test=-1), "n_test"),
    (dict(n_train=1_500_000, n_test=1_500_000), "n_train + n_test + n_val"),
])
def test_a_split_too_large_for_memory_is_refused_before_drawing(kwargs, name):
    with pytest.raises(ValueError, match=r"must be") as err:
        make_split("addition", **kwargs)
    assert name in str(err.value)


@pytest.mark.parametrize("n", [-3, 10**9, 2.0])
def test_sample_inputs_refuses_a_count_it_cannot_honour(n):
    with pytest.raises(ValueError, match=rf"n={n!r} must be an integer in \[0, "):
        sample_inputs("reversal", n)
    assert sample_inputs("reversal", 0) == []  # no trajectory inputs: none asked for
