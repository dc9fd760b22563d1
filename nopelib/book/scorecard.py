"""The replication at a glance: one row per reading of each claim, then what goes beyond.

A claim of the paper is judged in one or more readings (``nopelib.rules.claims``: e.g. "later layers
weaken it" as "the last layer ends below layer 1" and as "the last layer ends below its own
initialisation"). Readings are alternatives, never ANDed: each reading is a row with its own
verdict, under the claim's statement, which its readings share. Within a row the reading's
groups (tasks, configurations) are combined as ``claims.overall`` does: "replicates",
"partly", "fails", "cannot tell", or "untested" where nothing tests it yet.

Every row names its model (``model_label``: layers x width and the initial standard deviation
of the token embedding) and says whether it lies inside the paper's grid (``in_paper_grid``:
6-24 layers x 192-768 wide, the base model 6 x 384 at sigma 0.02). The random-initialisation
rows use the paper's base model (the grid row its grid, the sigma rows the initialisation
study's configurations); the trained rows come from the committed study of each training
profile asked for, the paper's model first (``TRAINED_PROFILES``): a profile with no committed
study gives "untested" rows that say it is not yet trained, and a study in flight counts each
task whose seeds are not all in as "cannot tell" until they are (``summary``'s
``n_in_flight``).

Every verdict comes from the rules of ``nopelib.rules.claims`` (the ones the chapters use), applied
to the chapters' own studies at the chapters' default parameters: each chapter's spec
(``nopelib.book.chapters``) declares them, and the studies come from the same calls through the
run and results caches (``nopelib.store.memo``), so within one build the scorecard judges the very
numbers the chapters show. ``to_html`` draws the rows as a list of verdicts: a coloured badge,
the claim and its reading, the model; the measurement, the evidence and the section folded
beneath.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from nopelib.book.beyond_rows import beyond_rows, long_rows, text_rows
from nopelib.book.past_length import length_rows
from nopelib.book import chapters
from nopelib.book.score_rows import (COLUMNS, INSIDE, OUTSIDE, PAPER_ROWS, PARTLY, SPECS,
                                     TRAINED_PROFILES, VERDICTS, init_rows, layer_suffix,
                                     make_row, probe_rows, trained_rows)
from nopelib.rules import beyond_claims
from nopelib.training.profiles import PROFILES


def _refs(rows: Sequence[Mapping]) -> dict[tuple[str, str], str]:
    """Each (claim, reading)'s reference: the claim's number ("4", or "beyond"), with a
    letter in order of appearance where several readings share the number ("4a", "4b";
    "beyond a")."""
    pairs = list(dict.fromkeys((r["claim"], r["reading"]) for r in rows))
    prefix = {pair: pair[0].split(":")[0] for pair in pairs}
    refs = {}
    for number in dict.fromkeys(prefix.values()):
        mine = [pair for pair in pairs if prefix[pair] == number]
        sep = "" if number.isdigit() else " "
        for i, pair in enumerate(mine):
            refs[pair] = number if len(mine) == 1 else f"{number}{sep}{chr(ord('a') + i)}"
    return refs


def _profiles(profiles: str | Sequence[str]) -> list[str]:
    profiles = [profiles] if isinstance(profiles, str) else list(dict.fromkeys(profiles))
    unknown = [p for p in profiles if p not in PROFILES]
    if not profiles or unknown:
        raise ValueError(f"profiles={profiles!r}: give one or more of {sorted(PROFILES)}")
    return profiles


def init_studies(p: Mapping[str, object]) -> dict[str, pd.DataFrame]:
    """The random-initialisation chapter's studies at its parameters ``p``, the very cached
    calls the chapter makes (``nopelib.book.chapters``)."""
    return dict(base=chapters.init_base(p), init=chapters.init_sigmas(p),
                grid=chapters.init_grid(p), grid_pred=chapters.init_grid_predicted(p),
                controls=chapters.init_controls(p))


def scorecard(profiles: str | Sequence[str] = TRAINED_PROFILES
              ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every row, one per reading: results 1 to 6 of the paper then what goes beyond it
    (``COLUMNS``), with the trained rows of each of ``profiles`` (in that order: the paper's
    model first), and the tests behind them, one row per reading and group
    (``GROUP_COLUMNS``)."""
    profiles = _profiles(profiles)
    p, pp = chapters.RANDOM_INIT.params(), chapters.PROBES.params()
    tasks = chapters.TRAINED.params()["tasks"]
    ev = init_studies(p)
    rows = init_rows(ev, p)
    studies = []
    for profile in profiles:
        trained, info = trained_rows(profile, tasks)
        rows += trained
        studies.append(info)
    rows += probe_rows(pp, studies)
    headline = studies[0]
    rows.append(make_row(SPECS[beyond_claims.SHORT_INPUTS], "the pattern on trained models at "
                         "lengths past the paper's", headline["model"], None, "group",
                         "no trained model on long sequences", "untested on trained models; at "
                         "initialisation see the long-sequence rows below"))
    rows += beyond_rows(ev, p) + long_rows() + text_rows() + length_rows()
    order = [spec[0] for spec in PAPER_ROWS]
    rows.sort(key=lambda r: order.index(r["claim"]) if r["claim"] in order else len(order))
    refs = _refs(rows)
    for row in rows:
        row["ref"] = refs[(row["claim"], row["reading"])]
    groups = pd.concat([r["groups"].assign(claim=f"{r['ref']}: "
                                           f"{r['claim'].split(':', 1)[-1].strip()}")
                        for r in rows if r["groups"] is not None], ignore_index=True)
    return pd.DataFrame(rows, columns=list(COLUMNS)), groups


def summary(card: pd.DataFrame) -> dict[str, int]:
    """The scorecard's counts: rows for the paper's results by verdict (``n_<verdict>``, spaces
    as underscores), those of the "cannot tell" rows that wait for a study still training
    (``n_in_flight``), the "fails" and "partly" rows judged beside tasks still to come
    (``n_provisional``: the tests those add can undo a "fails"), all of them
    (``n_paper_rows``), the paper's numbered results and the claims within them, those judged
    on a model outside the paper's grid, and the rows beyond the paper."""
    paper = card[~card.claim.str.startswith("beyond")]
    counts = {f"n_{v.replace(' ', '_')}": int((paper.verdict == v).sum()) for v in VERDICTS}
    waiting = int(((paper.verdict == "cannot tell") & (paper.in_flight > 0)).sum())
    provisional = int((paper.verdict.isin(["fails", "partly"]) & (paper.in_flight > 0)).sum())
    return {**counts, "n_in_flight": waiting, "n_provisional": provisional,
            "n_paper_rows": len(paper),
            "n_results": int(paper.claim.str.split(":").str[0].nunique()),
            "n_claims": int(paper.claim.nunique()),
            "n_outside": int((paper.grid == OUTSIDE).sum()),
            "n_beyond_rows": len(card) - len(paper)}


def tally(card: pd.DataFrame) -> pd.DataFrame:
    """The rows for the paper's results counted per model (the card's order: the paper's own
    model first), one column per verdict and ``rows``: a headline that pools two models would
    count one claim twice and hide which model says what."""
    paper = card[~card.claim.str.startswith("beyond")]
    counts = pd.crosstab(paper.model, paper.verdict).reindex(
        index=list(dict.fromkeys(paper.model)), columns=list(VERDICTS), fill_value=0)
    counts["rows"] = counts.sum(axis=1)
    counts.columns.name = None
    return counts


def tally_text(counts: pd.DataFrame, model: str) -> str:
    """One model's row of ``tally`` in words: "3 replicate, 1 fails, 2 cannot tell of 6"."""
    row = counts.loc[model]
    parts = [f"{row[v]} {VERB.get(v, v)}" for v in VERDICTS if row[v]]
    return ", ".join(parts) + f" (of {row['rows']} row{'s' if row['rows'] != 1 else ''})"


VERB = {"replicates": "replicate", "partly": "partly replicate", "fails": "fail"}  # plurals


# ---------------------------------------------------------------------------------------------
# the page

# plain CSS, shipped inside to_html's output (no stylesheet to fetch): a verdict's colour is
# the custom property --sc-colour its row's class sets
CSS = """
.scorecard { margin: 0.5em 0 1.5em; }
.scorecard .sc-part { margin: 1.1em 0 0.3em; font-size: 0.85em; font-weight: 600;
  letter-spacing: 0.04em; text-transform: uppercase; opacity: 0.7; }
.scorecard details.sc-row { margin: 0.25em 0; padding: 0.3em 0.6em;
  border-left: 5px solid var(--sc-colour); border-radius: 4px;
  background: rgba(128, 128, 128, 0.07); }
.scorecard details.sc-row > summary { cursor: pointer; line-height: 1.5; }
.scorecard .sc-badge { display: inline-block; min-width: 6.8em; margin-right: 0.4em;
  padding: 0 0.5em; border: 1.5px solid var(--sc-colour); border-radius: 0.8em;
  background: var(--sc-colour); color: #fff; font-size: 0.8em; font-weight: 600;
  text-align: center; }
.scorecard .sc-ref { margin-right: 0.3em; font-weight: 700; }
.scorecard .sc-reading { opacity: 0.85; }
.scorecard .sc-model { display: block; margin-left: 1.1em; font-size: 0.85em; opacity: 0.85; }
.scorecard .sc-grid { margin-left: 0.4em; padding: 0 0.35em; border: 1px solid;
  border-radius: 3px; font-size: 0.95em; }
.scorecard .sc-grid-inside { opacity: 0.75; }
.scorecard .sc-grid-outside { color: #b54708; font-weight: 700; }
.scorecard .sc-grid-partly { color: #b54708; }
.scorecard .sc-body { margin: 0.4em 0 0.2em 1.1em; font-size: 0.9em; }
.scorecard .sc-body dt { font-weight: 600; }
.scorecard .sc-body dd { margin: 0 0 0.35em 0; }
.scorecard .sc-replicates { --sc-colour: #2e7d32; }
.scorecard .sc-partly { --sc-colour: #e09b00; }
.scorecard .sc-partly .sc-badge { color: #1f1f1f; }
.scorecard .sc-fails { --sc-colour: #c1121f; }
.scorecard .sc-cannot-tell { --sc-colour: #6c757d; }
.scorecard .sc-untested { --sc-colour: #9aa0a6; }
.scorecard .sc-untested .sc-badge { background: transparent; color: inherit;
  border-style: dashed; }
"""
GRID_CLASSES = {INSIDE: "sc-grid-inside", OUTSIDE: "sc-grid-outside",
                PARTLY: "sc-grid-partly"}


def verdict_class(verdict: str) -> str:
    """The CSS class of a row with ``verdict`` (one of VERDICTS): "sc-cannot-tell"."""
    if verdict not in VERDICTS:
        raise ValueError(f"verdict={verdict!r} is not one of {VERDICTS}")
    return "sc-" + verdict.replace(" ", "-")


def _html_row(row) -> str:
    """One row: a summary line (badge, ref, claim, reading; the model and its grid words
    beneath), and folded under it the paper's statement, the measurement, the evidence and
    the section's link (the only text not escaped)."""
    claim = row.claim.split(":", 1)[-1].strip()
    body = "".join(f"<dt>{name}</dt><dd>{escape(str(text))}</dd>" for name, text in (
        ("The paper", row.paper), ("Measured", row.measured), ("Evidence", row.evidence)))
    return (f'<details class="sc-row {verdict_class(row.verdict)}"><summary>'
            f'<span class="sc-badge">{escape(row.verdict)}</span>'
            f'<span class="sc-ref">{escape(str(row.ref))}</span> '
            f'<span class="sc-claim">{escape(claim)}</span>'
            f'<span class="sc-reading"> — {escape(row.reading)}</span>'
            f'<span class="sc-model">{escape(row.model)}'
            f'<span class="sc-grid {GRID_CLASSES[row.grid]}">{escape(row.grid)}</span>'
            f'</span></summary><dl class="sc-body">{body}'
            f"<dt>Section</dt><dd>{row.section}</dd></dl></details>")


def to_html(card: pd.DataFrame) -> str:
    """The scorecard as a list of verdicts (a ``<details>`` per row, the page's CSS with
    it): every text escaped but the section's link."""
    missing = [c for c in COLUMNS if c not in card.columns]
    if missing:
        raise ValueError(f"to_html: the card lacks columns {missing}")
    parts, part = [f"<style>{CSS}</style>", '<div class="scorecard">'], None
    for row in card.itertuples(index=False):
        here = "Beyond the paper" if row.claim.startswith("beyond") else "The paper's results"
        if here != part:
            parts.append(f'<p class="sc-part">{escape(here)}</p>')
            part = here
        parts.append(_html_row(row))
    return "".join(parts) + "</div>"


VERDICT_COLOURS = {"holds": "#2a9d8f", "fails": "#c1121f", "cannot tell": "#8d99ae"}


def claim_margins(groups: pd.DataFrame, title: str) -> go.Figure:
    """The tests behind the scorecard (``scorecard.GROUP_COLUMNS``): per claim and group, the
    test nearest to failing as its distance from the claim's bound with its simultaneous
    interval (positive: on the claim's side), coloured by verdict."""
    sign = np.where(groups["above"], 1.0, -1.0)
    mid = sign * (groups["mean"] - groups["bound"])
    ends = np.sort(np.stack([sign * (groups["lo"] - groups["bound"]),
                             sign * (groups["hi"] - groups["bound"])]), axis=0)
    group = groups["group"].astype(str)
    layer = pd.Series([layer_suffix(g, int(n), " · ")
                       for g, n in zip(group, groups["weakest_layer"])], index=group.index)
    labels = (groups["claim"].str.split(":").str[0] + " · " + group + layer).to_numpy()
    fig = go.Figure()
    for verdict, colour in VERDICT_COLOURS.items():
        on = (groups["verdict"] == verdict).to_numpy()
        if on.any():
            fig.add_trace(go.Scatter(
                x=mid[on], y=labels[on], mode="markers", name=verdict,
                marker=dict(color=colour, size=8),
                error_x=dict(type="data", symmetric=False, array=ends[1][on] - mid[on],
                             arrayminus=mid[on] - ends[0][on], color=colour)))
    fig.add_vline(x=0.0, line_dash="dot", annotation_text="the claim's bound")
    fig.update_layout(title=title, height=160 + 18 * len(groups), xaxis_range=[-0.6, 0.6],
                      xaxis_title="distance from the bound, on the claim's side (> 0)",
                      yaxis=dict(autorange="reversed", categoryorder="array",
                                 categoryarray=list(labels)))
    return fig
