"""The committed early-dynamics study as tables: curves, falls, the theory's gaps, causes.

``nopelib.studies.early_study`` writes ``book/results/early_<profile>.json``, one run per
(task, seed, ablation); the early-dynamics chapter reads it through these tables, and judges
each ablation by ``nopelib.rules.beyond_claims.collapse_cause``, the rule fixed before the
study ran, under each CPU kernel set a file was trained on (``kernel_agreement``). The ablated
runs trained to the end of their budget (``early_full_<profile>*.json``, one file per kernel
set) are read beside the trained study's unablated ones by ``beyond_claims.full_reading``
(``full_table``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd

from nopelib.core.tasks import TASKS
from nopelib.rules import beyond_claims
from nopelib.rules.claims import past_plateau
from nopelib.studies.early_study import ABLATIONS, ablation_name
from nopelib.results.kinds import run_policy

MEASURED = ("rho", "value_common", "embedding_common", "value_axis", "embedding_axis",
            "entropy", "score_without_mlp", "predicted")  # block 1, per curve point


def frame(doc: dict) -> pd.DataFrame:
    """One row per run and curve point, step 0 (the initialisation) included: task, seed,
    ablation, step, lr, accuracy and the training loss (NaN at step 0), layer1 (the adjacency
    score after block 1) and the MEASURED quantities."""
    rows = []
    for run in doc["runs"]:
        head = {"task": run["task"], "seed": run["seed"],
                "ablation": ablation_name(run["frozen"])}
        rows.append({**head, "step": 0, "lr": 0.0, "accuracy": float("nan"),
                     "loss": float("nan"), "layer1": run["scores_init"][1],
                     **{k: run["measure_init"][k] for k in MEASURED}})
        c = run["curve"]
        for i, step in enumerate(c["step"]):
            rows.append({**head, "step": step, "lr": c["lr"][i], "accuracy": c["accuracy"][i],
                         "loss": c["loss"][i], "layer1": c["scores"][i][1],
                         **{k: c[k][i] for k in MEASURED}})
    return pd.DataFrame(rows)


def precisions(doc: Mapping) -> pd.DataFrame:
    """Per task of an early study, in TASKS' order: how its runs' training steps computed
    (``kinds.run_policy``; "not recorded" for runs from before runs recorded it under
    a profile that asks bf16, which trained in bf16 where their CPU had bf16 units) and the
    seeds they hold."""
    training = doc["provenance"]["training"]
    rows = []
    for task in TASKS:
        runs = [r for r in doc["runs"] if r["task"] == task]
        if not runs:
            continue
        policy = run_policy(runs[0], training)  # one per task: the file's check
        rows.append({"task": task, "precision": policy or "not recorded (the profile "
                     f"asked {training['precision']})",
                     "seeds": ", ".join(str(s) for s in sorted({r["seed"] for r in runs}))})
    return pd.DataFrame(rows)


def falls(runs: pd.DataFrame, level: float = beyond_claims.FALLS_AT) -> pd.DataFrame:
    """Per unablated run (task, seed): the first step where layer 1 is below ``level``
    (``beyond_claims.first_below``; NaN if never), its lowest and its last score in the window,
    the value vectors' leading-axis share at the last point, and the block-1 quantities at the
    fall beside their values at initialisation (``<name>_init``)."""
    out = []
    for (task, seed), g in runs[runs.ablation == "none"].groupby(["task", "seed"]):
        g = g.sort_values("step")
        step = beyond_claims.first_below(g.step.tolist(), g.layer1.tolist(), level)
        at = g[g.step == step].iloc[0] if step is not None else None
        row = {"task": task, "seed": seed, "falls_at": float("nan") if step is None else step,
               "lowest_layer1": beyond_claims.window_min(g.step.tolist(), g.layer1.tolist()),
               "last_layer1": float(g.layer1.iloc[-1]),
               "last_value_axis": float(g.value_axis.iloc[-1])}
        for name in ("layer1", "rho", "value_common", "value_axis", "embedding_axis",
                     "entropy"):
            row[f"{name}_init"] = float(g[name].iloc[0])
            row[name] = float("nan") if at is None else float(at[name])
        out.append(row)
    return pd.DataFrame(out)


def agreement(runs: pd.DataFrame) -> pd.DataFrame:
    """The theory along training, per unablated run: the largest |predicted - measured| over
    its curve points and its step (``beyond_claims.largest_gap``), against the residual the theory
    describes (``score_without_mlp``) and against the layer-1 score itself."""
    out = []
    for (task, seed), g in runs[runs.ablation == "none"].groupby(["task", "seed"]):
        g = g.sort_values("step")
        gap, step = beyond_claims.largest_gap(g.step, g.predicted, g.score_without_mlp)
        gap1, step1 = beyond_claims.largest_gap(g.step, g.predicted, g.layer1)
        out.append({"task": task, "seed": seed, "gap_without_mlp": gap, "at_step": step,
                    "gap_layer1": gap1, "at_step_layer1": step1})
    return pd.DataFrame(out)


def causes(runs: pd.DataFrame) -> pd.DataFrame:
    """``beyond_claims.collapse_cause`` per task and ablation: each seed's lowest layer-1 score in
    the window (``beyond_claims.window_min``), unablated and ablated, and the verdict; beside
    them, not judged, the ablated runs' lowest score of block 1's attention residual without
    its MLP (the part the averaging theory describes)."""
    lows, residual = {}, {}
    for key, g in runs.groupby(["task", "ablation", "seed"]):  # window_min is order-free
        lows[key] = beyond_claims.window_min(g.step.tolist(), g.layer1.tolist())
        residual[key] = beyond_claims.window_min(g.step.tolist(), g.score_without_mlp.tolist())
    out = []
    for task in sorted({t for t, _, _ in lows}):
        base = {s: v for (t, a, s), v in lows.items() if t == task and a == "none"}
        for name in ABLATIONS:
            if name == "none":
                continue
            held = {s: v for (t, a, s), v in lows.items() if t == task and a == name}
            if not held:
                continue
            out.append({"task": task, "ablation": name, "seeds": len(held),
                        "lowest_unablated": min(base.values()) if base else float("nan"),
                        "lowest_ablated": min(held.values()),
                        "lowest_ablated_without_mlp": min(
                            v for (t, a, _), v in residual.items() if t == task and a == name),
                        "verdict": beyond_claims.collapse_cause(base, held)})
    return pd.DataFrame(out, columns=["task", "ablation", "seeds", "lowest_unablated",
                                      "lowest_ablated", "lowest_ablated_without_mlp",
                                      "verdict"])


def matched(runs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Each ablation read at matched training loss (``beyond_claims.MATCHED_RULE``): per task,
    ablation and seed, the unablated run's fall (step, training loss there) and the ablated
    run's matched step (NaN: it never learned as far in the window), its lowest layer-1 score
    and lowest score without block 1's MLP up to there, and its last training loss; and per
    task and ablation, ``beyond_claims.matched_cause``'s verdict."""
    curves = {key: (g.step.tolist(), g.loss.tolist(), g.layer1.tolist(), g)
              for key, g in runs[runs.step > 0].sort_values("step").groupby(
                  ["task", "ablation", "seed"])}
    rows, verdicts = [], []
    for task in sorted({t for t, _, _ in curves}):
        base = {s: c[:3] for (t, a, s), c in curves.items() if t == task and a == "none"}
        for name in (a for a in ABLATIONS if a != "none"):
            held = {s: c for (t, a, s), c in curves.items() if t == task and a == name}
            if not held:
                continue
            for seed, (steps, loss, layer1, g) in sorted(held.items()):
                fall = beyond_claims.fall_loss(*base[seed]) if seed in base else None
                step = None if fall is None else beyond_claims.matched_step(steps, loss,
                                                                            fall[1])
                upto = g[g.step <= (step if step is not None else -1)]
                rows.append({"task": task, "ablation": name, "seed": seed,
                             "falls_at": fall[0] if fall else float("nan"),
                             "matched_loss": fall[1] if fall else float("nan"),
                             "matched_step": float("nan") if step is None else step,
                             "layer1": upto.layer1.min() if len(upto) else float("nan"),
                             "without_mlp": (upto.score_without_mlp.min() if len(upto)
                                             else float("nan")),
                             "last_loss": loss[-1]})
            verdicts.append({"task": task, "ablation": name, "seeds": len(held),
                             "verdict": beyond_claims.matched_cause(
                                 base, {s: c[:3] for s, c in held.items()})})
    return (pd.DataFrame(rows, columns=["task", "ablation", "seed", "falls_at", "matched_loss",
                                        "matched_step", "layer1", "without_mlp", "last_loss"]),
            pd.DataFrame(verdicts, columns=["task", "ablation", "seeds", "verdict"]))


CORRELATES = ("value_axis", "rho", "entropy")  # offered as causes of the fall; none ablated


def correlates(runs: pd.DataFrame) -> pd.DataFrame:
    """The control for each quantity offered as a cause of layer 1's fall: per unablated run,
    whether layer 1 falls (below ``beyond_claims.FALLS_AT``), the step read (its fall; in a
    run that does not fall, the median fall step of the runs that do), and each of
    CORRELATES there and at initialisation. A quantity that moves as much in the runs that
    do not fall is no sign of the cause."""
    base = runs[runs.ablation == "none"].sort_values("step")
    at = {key: beyond_claims.first_below(g.step.tolist(), g.layer1.tolist())
          for key, g in base.groupby(["task", "seed"])}
    fell = [s for s in at.values() if s is not None]
    median = float(pd.Series(fell).median()) if fell else float("nan")
    out = []
    for (task, seed), g in base.groupby(["task", "seed"]):
        step = at[task, seed] if at[task, seed] is not None else median
        point = g.iloc[(g.step - step).abs().argmin()] if step == step else None
        row = {"task": task, "seed": seed, "falls": at[task, seed] is not None,
               "step": float("nan") if point is None else float(point.step)}
        for name in CORRELATES:
            row[f"{name}_init"] = float(g[name].iloc[0])
            row[name] = float("nan") if point is None else float(point[name])
        out.append(row)
    return pd.DataFrame(out)


# what each ablation holds at its initial values, in words
HELD = {"embedding": "the token embedding", "qk": "block 1's queries and keys",
        "both": "the token embedding and block 1's queries and keys",
        "values": "the token embedding and block 1's value path (its value vectors)",
        "attention": "the token embedding and all of block 1's attention",
        "mlp": "block 1's MLP (and the LayerNorm before it)",
        "untied": "the token embedding the blocks read, the output head untied and trained"}


KERNELS_DIFFER = " (withdrawn: the verdicts under the two CPU kernel sets differ)"


def answers(falls_table: pd.DataFrame, gaps: pd.DataFrame,
            cause_table: pd.DataFrame) -> dict[str, str]:
    """One plain sentence per task from ``falls``, ``agreement`` and ``causes`` (or
    ``with_kernels``): when layer 1 fell, what had moved by then, how far the theory missed,
    what each ablation's rule reads."""
    out = {}
    for task, f in falls_table.groupby("task"):
        fell = f.dropna(subset=["falls_at"])
        if fell.empty:
            when = (f"layer 1 never fell below {beyond_claims.FALLS_AT} (lowest "
                    f"{f.lowest_layer1.min():.3f})")
        else:
            steps = fell.falls_at.astype(int)
            when = (f"layer 1 fell below {beyond_claims.FALLS_AT} on {len(fell)} of {len(f)} seeds, "
                    f"at step {steps.min()}-{steps.max()}, with attention entropy still "
                    f"{fell.entropy.min():.3f} or more of uniform, rho {fell.rho.min():.2f}-"
                    f"{fell.rho.max():.2f} (initially {fell.rho_init.min():.2f}-"
                    f"{fell.rho_init.max():.2f}) and the value vectors' leading-axis share "
                    f"{fell.value_axis.min():.2f}-{fell.value_axis.max():.2f} (initially "
                    f"{fell.value_axis_init.min():.2f}-{fell.value_axis_init.max():.2f})")
        when += (f"; at the window's last point layer 1 was {f.last_layer1.min():.3f}-"
                 f"{f.last_layer1.max():.3f} and the leading-axis share "
                 f"{f.last_value_axis.min():.2f}-{f.last_value_axis.max():.2f}")
        g = gaps[gaps.task == task]
        theory = (f"the theory fed the measured quantities missed the no-MLP score by up to "
                  f"{g.gap_without_mlp.max():.3f}")
        rules = [f"holding {HELD[r.ablation]}"
                 f" left layer 1 at {r.lowest_ablated:.3f} or above (unablated "
                 f"{r.lowest_unablated:.3f}; block 1's attention residual without its MLP "
                 f"{r.lowest_ablated_without_mlp:.3f} or above): {r.verdict}"
                 + (KERNELS_DIFFER if getattr(r, "kernels", "") == "differ" else "")
                 for r in cause_table[cause_table.task == task].itertuples()]
        out[task] = "; ".join([when, theory, *rules]) + "."
    return out


def kernel_agreement(native: pd.DataFrame, other: pd.DataFrame) -> pd.DataFrame:
    """``causes`` of the same study trained under two CPU kernel sets (``frame``s of the
    two files), on the runs both hold, per task and ablation whose seeds there are those of
    the task's unablated runs there: the lowest scores and the verdict under each
    (``_other``), and whether the verdicts agree. A pair either file lacks, or holds on
    other seeds, is left out rather than read as a disagreement."""
    ids = ["task", "ablation", "seed"]
    common = set(map(tuple, native[ids].values)) & set(map(tuple, other[ids].values))
    seeds: dict[tuple, set] = {}
    for task, name, seed in common:
        seeds.setdefault((task, name), set()).add(seed)
    paired = {(t, a) for (t, a), s in seeds.items()
              if a != "none" and s == seeds.get((t, "none"))}
    tasks = {t for t, _ in paired}
    keep = [(t, a, s) for t, a, s in common if (t, a) in paired or a == "none" and t in tasks]
    index = pd.MultiIndex.from_tuples(keep, names=ids) if keep else None
    a, b = ((f.set_index(ids).loc[index].reset_index() if keep else f.iloc[:0])
            for f in (native, other))
    both = causes(a).merge(causes(b), on=["task", "ablation", "seeds"],
                           suffixes=("", "_other"))
    both["agree"] = both.verdict == both.verdict_other
    both["verdict_both"] = [beyond_claims.across_kernels([a, b]) for a, b in
                            zip(both.verdict, both.verdict_other)]
    return both[["task", "ablation", "seeds", "lowest_unablated", "lowest_unablated_other",
                 "lowest_ablated", "lowest_ablated_other", "verdict", "verdict_other",
                 "agree", "verdict_both"]]


def with_kernels(cause_table: pd.DataFrame, kernel_table: pd.DataFrame) -> pd.DataFrame:
    """``causes`` with each verdict that ``kernel_agreement`` compared replaced by its
    verdict under every kernel set (``beyond_claims.across_kernels``), and a column
    ``kernels`` that says which: "agree", "differ" or "one set" (not compared).
    ``kernel_table`` may stack the tables of several reruns (one row per task, ablation and
    rerun): a verdict stands only where the native one and every rerun's agree."""
    others: dict[tuple, list[str]] = {}
    native: dict[tuple, str] = {}
    for r in kernel_table.itertuples():
        native[(r.task, r.ablation)] = r.verdict
        others.setdefault((r.task, r.ablation), []).append(r.verdict_other)
    out = cause_table.copy()
    keys = list(zip(out.task, out.ablation))
    verdicts = {k: [native[k], *others[k]] for k in others}
    out["kernels"] = ["one set" if k not in verdicts else
                      "agree" if len(set(verdicts[k])) == 1 else "differ" for k in keys]
    out["verdict"] = [beyond_claims.across_kernels(verdicts[k]) if k in verdicts else v
                      for k, v in zip(keys, out.verdict)]
    return out


def _full_row(task: str, seed: int, ablation: str, kernels: str, accuracy: float,
              steps: int, curve_steps: list, curve_accuracy: list, scores_init: list,
              scores: list) -> dict:
    layer1 = [scores_init[1], *(row[1] for row in scores)]
    plateau = past_plateau(curve_steps, curve_accuracy, steps)
    return {"task": task, "seed": seed, "ablation": ablation, "kernels": kernels,
            "steps": steps, "accuracy": accuracy, "learned_from": plateau["learned_from"],
            "tail": plateau["tail"], "lowest_layer1": min(layer1), "last_layer1": layer1[-1],
            "reading": beyond_claims.full_reading(accuracy, curve_steps, curve_accuracy,
                                                  layer1, steps)}


def _kernels(doc: dict) -> str:
    return doc["provenance"].get("cpu_capability", "not recorded")


def _full_runs(docs: Sequence[dict], trained: Mapping[str, dict]) -> list[tuple]:
    """(task, seed, ablation, kernels, accuracy, steps, curve steps, curve accuracy, initial
    scores, scores per point) of every run of the ``--full`` files and of the unablated
    trained-study run of each of their (task, seed)s that ``trained`` holds."""
    out = [(r["task"], r["seed"], ablation_name(r["frozen"]), _kernels(doc), r["accuracy"],
            r["steps"], r["curve"]["step"], r["curve"]["accuracy"], r["scores_init"],
            r["curve"]["scores"]) for doc in docs for r in doc["runs"]]
    held = {(r["task"], r["seed"]) for doc in docs for r in doc["runs"]}
    for task, study in trained.items():
        for r in study["runs"]:
            if (task, r["seed"]) in held:
                t = r["trajectory"]
                out.append((task, r["seed"], "none", _kernels(study), r["accuracy"],
                            r["steps"], t["step"], t["accuracy"], r["scores_init"],
                            t["scores"]))
    names, tasks = list(ABLATIONS), list(TASKS)
    return sorted(out, key=lambda r: (tasks.index(r[0]), names.index(r[2]), r[1], r[3]))


def full_frame(docs: Sequence[dict], trained: Mapping[str, dict]) -> pd.DataFrame:
    """The runs ``full_table`` reads, one row per run and curve point (step 0, the
    initialisation, included): task, seed, ablation, kernels, step, layer1, accuracy (NaN
    at 0)."""
    rows = []
    for task, seed, name, kernels, _, _, steps, accuracy, init, scores in _full_runs(
            docs, trained):
        head = {"task": task, "seed": seed, "ablation": name, "kernels": kernels}
        rows.append({**head, "step": 0, "layer1": init[1], "accuracy": float("nan")})
        rows += [{**head, "step": s, "layer1": row[1], "accuracy": a}
                 for s, a, row in zip(steps, accuracy, scores, strict=True)]
    return pd.DataFrame(rows)


def full_table(docs: Sequence[dict], trained: Mapping[str, dict]) -> pd.DataFrame:
    """``beyond_claims.full_reading`` of every run of the ``early_study --full`` files
    (``docs``, one per CPU kernel set they trained under) and, per task they hold, of the
    unablated run of each of their seeds in the committed trained study (``trained``: task
    -> that file; ablation "none"): the kernels, steps trained, exact match on the whole
    test split, where the learning curve reached the learnedness line for good and the
    share of the run after it, layer 1's lowest and last score, and the reading. Rows by
    task, then ablation, seed and kernels."""
    rows = [_full_row(*run) for run in _full_runs(docs, trained)]
    return pd.DataFrame(rows)


def kernel_splits(full: pd.DataFrame) -> tuple[int, int]:
    """Of ``full_table``'s ablated runs, how many (task, seed, ablation) were trained under
    more than one kernel set, and on how many of those the readings differ."""
    ablated = full[full.ablation != "none"]
    reads = ablated.groupby(["task", "seed", "ablation"]).reading
    twice = reads.agg(["nunique", "size"]).query("size > 1")
    return len(twice), int((twice["nunique"] > 1).sum())


def untrained_full(full: pd.DataFrame, tasks: Sequence[str] = tuple(TASKS),
                   ablations: Sequence[str] = ABLATIONS) -> list[str]:
    """The (task, ablation) pairs, "task ablation", of which ``full_table`` holds no run
    (the unablated "none" left out: it is the trained study's)."""
    held = set(zip(full.task, full.ablation))
    return [f"{t} {a}" for t in tasks for a in ablations
            if a != "none" and (t, a) not in held]
