"""The benchmark's chapter section: each chapter executed as the book build does.

The benchmark's chapter section: each chapter of ``_toc.yml`` executed with nbclient, as
the book build does, with the results cache off and then on (``python -m nopelib.tools.bench``)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from unittest import mock

from nopelib.store.cache import PACKAGE_DIR
from nopelib.store.memo import MEMO_ENV

ROOT = PACKAGE_DIR.parent


def toc_chapters(toc: Path = ROOT / "_toc.yml") -> list[Path]:
    """The notebooks listed in ``_toc.yml``, in reading order."""
    import yaml  # the bench extra (pip install .[bench]); every module imports without it

    files = [entry["file"] for entry in yaml.safe_load(toc.read_text())["chapters"]]
    return [ROOT / f"{f}.ipynb" for f in files if (ROOT / f"{f}.ipynb").is_file()]


def execute(path: Path, timeout_s: int, memo_on: bool) -> tuple[float, str]:
    """Wall seconds and status of executing one notebook with nbclient, as the book build
    does, cwd = its folder. (Under papermill the averaging chapter's ipywidgets cell did not
    finish when this was written.)"""
    import nbclient  # the bench extra
    import nbformat

    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=timeout_s, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    start = time.perf_counter()
    # the kernel inherits this environment; patch.dict restores it afterwards
    with mock.patch.dict(os.environ, {MEMO_ENV: "1" if memo_on else "0"}):
        try:
            client.execute()
            status = "ok"
        except Exception as exc:
            last = str(exc).strip().splitlines()[-1][:200]
            status = f"failed: {type(exc).__name__}: {last}"
    return time.perf_counter() - start, status


def bench_chapters(timeout_s: int = 3600) -> dict:
    """Wall time of executing each chapter with its default parameters: every study computed
    (results cache off), then a rerun with the studies read from the results cache."""
    rows = []
    for path in toc_chapters():
        computed_s, status = execute(path, timeout_s, memo_on=False)
        fill_s, fill_status = execute(path, timeout_s, memo_on=True)  # fills the results cache
        rerun_s, rerun_status = execute(path, timeout_s, memo_on=True)
        bad = [s for s in (status, fill_status, rerun_status) if s != "ok"]
        rows.append({"chapter": path.stem, "wall_s": computed_s, "fill_s": fill_s,
                     "rerun_s": rerun_s, "speedup": computed_s / rerun_s,
                     "status": bad[0] if bad else "ok"})
    return {"note": "trained runs come from the nopelib run cache when it is warm", "rows": rows}
