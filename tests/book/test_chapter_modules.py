"""Tests of the chapters' own modules (nopelib.book.probes, text, trained, early_dynamics): each
holds its chapter's rules and spec, a second page reads its parent's rules, the study modules
hold no chapter's rules, and the probes chapter's menu figure shows one table at a time."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from nopelib.book import chapters, early_dynamics, probes, text, trained
from nopelib.core.cost import ALLOW_SLOW_ENV
from nopelib.studies import early_study, probe_study, text_study, trained_study


def test_the_registry_names_each_chapter_modules_spec():
    assert chapters.PROBES is probes.CHAPTER and chapters.TEXT is text.CHAPTER
    assert chapters.TRAINED is trained.CHAPTER
    assert chapters.EARLY_DYNAMICS is early_dynamics.CHAPTER
    assert chapters.PROBES_CONTROLS is probes.CONTROLS
    assert chapters.TRAINED_SMALL is trained.SMALL
    for spec in (probes.CHAPTER, probes.CONTROLS, text.CHAPTER, trained.CHAPTER, trained.SMALL,
                 early_dynamics.CHAPTER):
        assert chapters.CHAPTERS[spec.name] is spec


def test_a_second_page_takes_its_parents_rules_and_defaults(monkeypatch):
    for page, parent in ((probes.CONTROLS, probes.CHAPTER), (trained.SMALL, trained.CHAPTER)):
        assert set(page.rules) < set(parent.rules)
        for name in page.rules:
            assert page.rules[name] is parent.rules[name], name
            assert page.defaults[name] == parent.defaults[name], name
    # a joint cost travels with its rule: the controls page refuses what the chapter refuses
    monkeypatch.delenv(ALLOW_SLOW_ENV, raising=False)
    with pytest.raises(ValueError, match="planted_fit_tokens"):
        probes.CONTROLS.params(model_seeds=list(range(100)), planted_fit_tokens=100_000)


def test_the_study_modules_hold_no_chapter_rules():
    for module in (probe_study, text_study, trained_study):
        assert not hasattr(module, "CHAPTER_PARAMS"), module.__name__
    # the exception, kept where the checkpoint keys of its full runs read it
    assert early_dynamics.CHAPTER.rules is early_study.CHAPTER_PARAMS


def _table(shift: float) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    return pd.DataFrame([dict(layer=layer, features=kind, seed=seed, nrmse=rng.random(),
                              r=shift + rng.random() / 10)
                         for layer in range(3) for kind in probes.PROBE_COLORS
                         for seed in range(2)])


def test_the_menu_figure_shows_one_table_at_a_time():
    tables = {"addition": _table(0.1), "reversal": _table(0.5)}
    titles = {"addition": "probes on addition", "reversal": "probes on reversal"}
    fig = probes.probe_metrics_menu(tables, titles)
    per = len(probes.probe_metrics(tables["addition"], "").data)
    assert len(fig.data) == 2 * per
    assert [t.visible for t in fig.data] == [True] * per + [False] * per
    assert fig.layout.title.text == "probes on addition"
    buttons = fig.layout.updatemenus[0].buttons
    assert [b.label for b in buttons] == ["addition", "reversal"]
    shown, layout = buttons[1].args
    assert shown["visible"] == [False] * per + [True] * per
    assert layout["title.text"] == "probes on reversal"
    # the reversal traces are the reversal table's: R near 0.5, not addition's 0.1
    r_traces = [t for t, v in zip(fig.data, shown["visible"]) if v and t.xaxis == "x2"]
    assert all(min(t.y) > 0.4 for t in r_traces) and r_traces
