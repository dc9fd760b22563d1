"""The benchmark's report: its result as JSON (written atomically) and as text tables.

``nopelib.tools.bench`` measures; this module only writes and formats what it measured.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from nopelib.store.cache import commit_file


def write_json(result: dict, path: str | Path) -> None:
    """Write atomically (``cache.commit_file``: a fresh temporary name beside the target, then
    renamed; missing folders are created). The text is made first: a NaN fails here, before
    any file is touched."""
    commit_file(Path(path), json.dumps(result, indent=1, allow_nan=False).encode())


def section(out: list[str], title: str, sec: dict, columns: list[str]) -> None:
    """Append a section: its title, then its error, "skipped", or a table of the ``columns``
    of its rows ("-" where a row lacks one)."""
    out.append(f"\n[{title}]")
    if "error" in sec or sec.get("skipped"):
        out.append(sec.get("error", "skipped"))
    else:
        rows = pd.DataFrame(sec["rows"]).reindex(columns=columns)
        out.append(rows.to_string(index=False, na_rep="-", float_format="{:.4g}".format))


def format_table(result: dict) -> str:
    """The result as readable text tables."""
    m, ext, adj, par = result["meta"], result["extraction"], result["adjacency"], result["parallel"]
    ev, pr = result["evaluation"], result["probe"]
    out = [f"nopelib benchmark  device={m['device']}  torch={m['torch']}  "
           f"threads={m['torch_threads']}  small={m['small']}  "
           f"load avg start={m['loadavg_start']} end={m.get('loadavg_end')}"]
    for name, sec in result["train"].items():
        section(out, f"train: {name}, batch {sec.get('batch_size')}, T per task "
                 f"{sec.get('seq_len')}", sec, ["name", "step_ms", "step_ms_min", "step_ms_max",
                                                "tokens_per_s", "speedup", "compile_s", "status"])
    section(out, f"extraction: {ext.get('n_sequences')} task inputs", ext,
             ["name", "seq_per_s", "speedup"])
    section(out, f"adjacency_score: all layers of one sequence, numba threads "
             f"{adj.get('numba_threads')}", adj,
             ["T", "numba_s", "reference_s", "speedup_vs_reference", "mean_score"])
    section(out, f"parallel: cpu profile, {len(par.get('runs', []))} runs of "
             f"{par.get('steps')} steps", par, ["name", "wall_s", "speedup"])
    section(out, f"evaluation: cpu model, {ev.get('n_pairs')} test pairs per task", ev,
             ["task", "greedy_s", "teacher_forced_s", "speedup", "accuracy_greedy",
              "accuracy_teacher_forced"])
    section(out, f"probe: {pr.get('n_sequences')} sequences of T={pr.get('T')}, window "
             f"{pr.get('w')}, layer 1", pr, ["name", "seconds", "selected"])
    section(out, "chapters", result["chapters"],
             ["chapter", "wall_s", "fill_s", "rerun_s", "speedup", "status"])
    out.append(f"\ntotal {m.get('total_s', 0):.1f} s")
    return "\n".join(out)
