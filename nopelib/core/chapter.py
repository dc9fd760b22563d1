"""A chapter's spec: its parameters' defaults and rules and the claims it judges, declared once.

A chapter of the book is run three ways: by the book build at its defaults, by papermill with
some parameters overridden, and through the scorecard, which judges the paper's claims on the
chapters' own studies at their defaults. All three read one ``ChapterSpec`` from the package:

    CHAPTER = ChapterSpec("random_init", RULES, defaults={"n_seeds": 10, ...},
                          claims={init_claims.LAYER0: "the-adjacency-score-per-layer", ...})

The chapter's ``parameters`` cell (the one papermill rewrites) holds the same defaults as
literal assignments, because papermill needs them there; ``tests/book/test_chapters.py`` reads every
cell and fails when a value or a name differs from its spec. The chapter's next cell calls
``params = CHAPTER.check(globals())``; the scorecard calls ``CHAPTER.params()`` and the same study
functions, so the two share cache entries without executing or re-typing a notebook cell.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from nopelib.core.cost import Cost
from nopelib.core.params import Rule, check_params


@dataclass(frozen=True)
class ChapterSpec:
    """One chapter: ``name`` (its notebook under ``book/``), the ``rules`` of its parameters
    (``nopelib.core.params``), their ``defaults`` in the parameters cell's order, and the
    paper's ``claims`` it judges (label in ``nopelib.rules`` -> the section's anchor)."""

    name: str
    rules: Mapping[str, Rule]
    defaults: Mapping[str, Any]
    claims: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if list(self.rules) != list(self.defaults):
            raise ValueError(f"chapter {self.name!r}: the defaults name {list(self.defaults)}, "
                             f"the rules {list(self.rules)}; give both the same names in the "
                             "same order")
        # frozen copies: a caller that edits what params() returns cannot edit the spec
        object.__setattr__(self, "defaults", MappingProxyType(copy.deepcopy(dict(
            self.defaults))))
        object.__setattr__(self, "claims", MappingProxyType(dict(self.claims)))
        check_params(self.rules, dict(self.defaults))

    def check(self, namespace: Mapping[str, Any]) -> Mapping[str, Any]:
        """The parameters of a running chapter (its ``globals()``), checked against the rules
        before any work (``check_params``: one error naming every bad value); returns them,
        read-only (so that the check, run again in the same kernel, does not take the
        returned mapping for an injected parameter)."""
        check_params(self.rules, namespace)
        return MappingProxyType({name: namespace[name] for name in self.rules})

    def params(self, **overrides: Any) -> dict[str, Any]:
        """The defaults with ``overrides`` (checked like a papermill run's), a fresh copy."""
        unknown = sorted(set(overrides) - set(self.rules))
        if unknown:
            raise ValueError(f"chapter {self.name!r} has no parameter(s) {unknown}; its "
                             f"parameters: {list(self.rules)}")
        values = {**copy.deepcopy(dict(self.defaults)), **overrides}
        check_params(self.rules, values)
        return values


def with_costs(rules: Mapping[str, Rule],
               costs: Mapping[str, tuple[Cost, ...]]) -> dict[str, Rule]:
    """A chapter's rules with joint costs (``params.Rule.costing``) on the parameters named in
    ``costs``: parameters each within its own bound can still run for a day together, and a
    chapter refuses that before any work (``NOPELIB_ALLOW_SLOW=1`` lifts it with a warning).
    Each chapter's module (``nopelib.book``) attaches them, not the study modules, so that no
    study's cache key moves when a chapter's costs do."""
    out = dict(rules)
    for name, extra in costs.items():
        for cost in extra:
            out[name] = out[name].costing(cost)
    return out
