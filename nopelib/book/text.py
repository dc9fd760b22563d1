"""The text chapter's rules and spec (``book/text.ipynb``): its parameters and their defaults.

The chapter's live part scores NoPE text models at initialisation (``nopelib.studies.text_study``,
through ``nopelib.book.chapters.text_init``, the scorecard's call too); its trained part reads
the committed text study. It draws with ``nopelib.book.viz.score_lengths`` (score against length,
shared with the long-sequence chapter) and has no figure of its own.
"""

from __future__ import annotations

from nopelib.core.chapter import ChapterSpec
from nopelib.core.params import SEED, Choice, ListOf
from nopelib.rules import beyond_claims
from nopelib.training.text_lm import TEXT_PROFILES

# The rules of the chapter's parameters
CHAPTER_PARAMS = {
    "profile": Choice(TEXT_PROFILES),
    "seeds": ListOf(SEED, unique=True, min_len=beyond_claims.TEXT_MIN_SEEDS, max_len=10,
                    why="the seed is the unit (3 for the rule); each seed scores one model at "
                        "every length, about half a minute"),
    "lengths": ListOf(Choice(beyond_claims.TEXT_LENGTHS), unique=True,
                      why="the rule's lengths (beyond_claims.TEXT_LENGTHS)"),
}

CHAPTER = ChapterSpec("text", CHAPTER_PARAMS, dict(
    profile="text",  # the text study's model and schedule (nopelib.training.text_lm)
    seeds=[0, 1, 2],  # model seeds at initialisation: the unit
    lengths=[32, 64, 128, 256, 512, 1024],  # held-out lengths (the rule's)
))
