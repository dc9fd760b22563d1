"""The scorecard's rows beyond the paper: the initialisation's extra readings, long sequences, text.

Each row is judged, like the paper's rows (``score_rows``), by a rule of ``nopelib.rules``
fixed before the data, and labelled "beyond" so it is never read as the paper's claim.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import pandas as pd

from nopelib.book.chapters import TEXT, text_init
from nopelib.book.score_rows import (OUTSIDE, grid_status, in_paper_grid, link, make_row,
                                     model_label, model_of, span_text)
from nopelib.core import corpus
from nopelib.core.model import GPTConfig
from nopelib.rules import beyond_claims, claims, init_claims
from nopelib.core import analysis as an
from nopelib.studies import long_context
from nopelib.results import files as results, text_tables
from nopelib.averaging.theory_studies import prediction_table
from nopelib.training import text_lm


def beyond_rows(ev: Mapping[str, pd.DataFrame], p: Mapping[str, object]) -> list[dict]:
    """Rows past the paper: the averaging theory's prediction of every grid configuration's
    side of 0.8, and the bidirectional control's chance level."""
    level = p["level"]
    pred = prediction_table(ev["grid"], ev["grid_pred"], level)
    sides = init_claims.prediction_sides(pred["predicted"], pred["measured"])
    agree = int((sides == "holds").sum())
    grid = [replace(GPTConfig(), **o) for o in an.grid_overrides(p["grid_layers"],
                                                                  p["grid_widths"])]
    label, inside = model_of(grid, ", the grid")
    theory = dict(
        groups=None, claim="beyond: the averaging theory",
        reading="each configuration's layer-1 score on the predicted side of 0.8",
        model=label, grid=inside, paper="(not in the paper) The closed form predicts, before "
        "any measurement, on which side of 0.8 each configuration's layer-1 score falls.",
        measured=f"same side in {agree} of {len(pred)} configurations",
        verdict=claims.overall(sides), evidence=f"live: {len(pred)} configurations x "
        f"{p['grid_seeds']} seeds, prediction from the initialisation alone",
        section=link("random_init_more", "depth-and-width-predicted-then-measured"))
    controls = ev["controls"]
    bid = claims.claim_table(init_claims.chance_control(controls[~controls.causal]), by="group")
    spec = ("beyond: bidirectional control", "(not in the paper) Without the causal mask the "
            "pattern cannot form: every layer within 0.1 of 0.5.", "random_init_more",
            "controls-the-paper-does-not-show")
    control = make_row(spec, f"every layer within {init_claims.NEAR_CHANCE:g} of 0.5",
                       model_of(replace(GPTConfig(), causal=False)), bid, "group",
                       "live: bidirectional base model")
    return [theory, control]


LONG_PAPER = (  # the long-sequence readings (beyond_claims.LONG_CLAIMS), as the scorecard states them
    "(not in the paper) At initialisation, the layer-1 score stays in the paper's range "
    "(0.8 or more) along the committed study's longest sequences.",
    "(not in the paper) Every layer stays above chance (0.6) along them.",
    "(not in the paper) The criticism (Dawes et al.): along them, nearby positions cannot be "
    "told apart in the global-attention models (\"holds\" is the criticism holding).",
    "(not in the paper) The contrast the criticism expects: a sliding-window model still "
    "tells nearby positions apart along them.",
)


def _long_models(runs: Sequence[Mapping], base: GPTConfig) -> dict[str, tuple[str, str]]:
    """The long-sequence study's models as rows name them: "global" (global attention at
    every width), "window" (the sliding-window models) and "all"."""
    widths = sorted({r["n_embd"] for r in runs if not r["window"]})
    windows = sorted({(r["n_embd"], r["window"]) for r in runs if r["window"]})
    glob = [replace(base, n_embd=w) for w in widths]
    win = [replace(base, n_embd=w) for w, _ in windows]
    said = ", ".join(f"{w} wide" for w, _ in windows)
    span = span_text([W for _, W in windows]) if windows else ""
    models = {}
    if glob:
        models["global"] = model_of(glob, ", global attention")
    if win:  # the paper's models attend to every earlier position: a window is outside
        models["window"] = (model_label(win) + f", sliding window {span}", OUTSIDE)
        models["all"] = (model_label(glob + win) + f", global attention and a sliding window "
                         f"{span} ({said})" if glob else models["window"][0],
                         grid_status([in_paper_grid(c) for c in glob] + [False] * len(win)))
    else:
        models["all"] = models["global"]
    return models


def long_rows() -> list[dict]:
    """Rows past the paper from the committed long-sequence study
    (``nopelib.studies.long_context``): one per reading of ``beyond_claims.long_claims`` and the theory's
    resolution prediction; untested rows without the study."""
    doc = results.load_all("long").get("long_context.json")
    anchor = "the-verdict-on-the-criticism"
    specs = [(c, r, (c, p, "long_sequences", anchor))
             for (c, r), p in zip(beyond_claims.LONG_CLAIMS, LONG_PAPER)]
    if doc is None:
        base = model_of(GPTConfig())
        return [make_row(spec, r, base, None, "group", "no committed study",
                         "run python -m nopelib.studies.long_context") for _, r, spec in specs]
    frames = long_context.run_frames(doc["runs"])
    T = doc["provenance"]["T"]
    models = _long_models(doc["runs"], GPTConfig(**doc["provenance"]["base"]))
    # the readings' models: every model, every model, global attention, the windows
    which = ("all", "all", "global", "window")
    table = claims.claim_table(beyond_claims.long_claims(frames["scores"], frames["order"]),
                               by="group")
    evidence = f"committed: random models at {T:,} tokens"
    rows = [make_row(spec, r, models.get(w, models["all"]),
                     table[(table.claim == c) & (table.reading == r)], "group", evidence)
            for (c, r, spec), w in zip(specs, which)]
    res = long_context.resolution(frames["order"])
    agree = beyond_claims.resolution_agreement(res)
    informative = agree[agree != "uninformative"]
    n = int((informative == "agrees").sum())
    bounded, open_top = long_context.agreement_bounds(res, agree)
    label, inside = models["all"]
    rows.append(dict(
        groups=None, claim="beyond: the theory's resolution d*(i)",
        reading="d*(i) inside the measured interval, every informative octave and model",
        model=label, grid=inside,
        paper="(not in the paper) The averaging theory predicts, before the model runs, how far "
        "back row i tells a position from its neighbour (d*(i), layer 1).",
        measured=f"inside the measured interval in {n} of the {len(informative)} informative "
                 f"octaves and models ({bounded} inside an interval bounded on both sides, "
                 f"{open_top} inside one open at the top; {len(agree) - len(informative)} of "
                 f"{len(agree)} say nothing either way: predicted unresolved, interval open "
                 "at the top)",
        verdict=claims.overall(informative.map({"agrees": "holds", "disagrees": "fails"})),
        evidence=f"{evidence}; pointwise t intervals over seeds",
        section=link("long_sequences", "resolution-predicted-beside-measured")))
    return rows


TEXT_PAPER = (  # the text readings (beyond_claims.TEXT_CLAIMS), as the scorecard states them
    "(not in the paper) The pattern shows on real text before training, in the text study's "
    "NoPE models.",
    "(not in the paper) A NoPE language model trained on real text shows it in layer 1.",
    "(not in the paper) ... in the paper's layer-1 range (0.8 or more).",
    "(not in the paper) ... in every layer.",
    "(not in the paper) ... past the length it was trained on.",
    "(not in the paper) Claim 4 on text: its last layer ends below layer 1.",
    "(not in the paper) NoPE pays for position on text: higher test bits per character than "
    "a learned position table.",
)


def text_rows() -> list[dict]:
    """Rows past the paper on real text (``beyond_claims.TEXT_CLAIMS``): the initialisation reading
    judged on the text chapter's live study at its default parameters (the same cached call
    as the chapter's), the trained readings on the committed text study of the chapter's
    profile (``book/results/text_<profile>.json``), untested until it holds the rule's seeds."""
    p = TEXT.params()
    prof = text_lm.get_text_profile(p["profile"])
    model = model_of(prof.config("none", len(corpus.load().vocab)))
    specs = [(c, r, (c, paper, "text", anchor)) for (c, r), paper, anchor in zip(
        beyond_claims.TEXT_CLAIMS, TEXT_PAPER,
        ["the-first-reading-of-the-rule"] + ["the-trained-study-committed"]
        * (len(beyond_claims.TEXT_CLAIMS) - 1))]
    scores = text_init(p)
    table = claims.claim_table(beyond_claims.text_init_claims(scores), by="group")
    claim, reading, spec = specs[0]
    rows = [make_row(spec, reading, model, table, "group",
                     "live: the text study's NoPE models at initialisation, held-out windows of "
                     "the test books")]
    name = f"text_{prof.name}.json"
    trained, note = None, "no committed text study: run python -m nopelib.studies.text_study"
    doc = results.load_all("text").get(name)
    if doc is not None:
        frames = text_tables.frames(doc)
        seeds_in = frames["bpc"].groupby("encoding").seed.nunique()
        if seeds_in.min() >= beyond_claims.TEXT_MIN_SEEDS:
            trained = claims.claim_table(beyond_claims.text_claims(
                frames["scores"], frames["bpc"], doc["provenance"]["unigram_bpc"],
                context=prof.context), by="group")
        else:
            note = (f"not judged: {name} holds {seeds_in.min()} seeds of an encoding, the "
                    f"rule needs {beyond_claims.TEXT_MIN_SEEDS}")
    evidence = f"committed: {name}, the trained text study"
    return rows + [make_row(spec, r, model, None if trained is None
                            else trained[trained.reading == r], "group", evidence, note)
                   for _, r, spec in specs[1:]]
