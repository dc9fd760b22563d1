"""The campaign on a GPU: the prepared device command, and the merge of the files it returns.

A device session reaches a GPU machine through one shell command (at most 2,000 characters and
10 minutes) run in a copy of the working tree, and only files written under ``$OUT`` come back
(at most 8, 16 MiB each): a run's checkpoints never return. ``COMMAND`` is that command, one
line to paste (``python -m nopelib.studies.campaign_gpu`` prints it). It runs the campaign
with ``--device cuda --streams 5 --until 9m`` on the copy's own ``book/results``, so the
committed study files grow exactly as on the CPU (``trained_study`` writes each finished run
at once, in the committed precision: ``task_precision.task_profile``); five streams are the
next task's missing seeds side by side, each its own process, keyed and filed under
``paper_study`` itself (a batched run is filed under its ``+batched`` twin, which the
scorecard does not count). Then it copies the result files the sitting changed (study files,
ledger, ``MANIFEST.json``; about 0.5 MB a study file), its output and the runs' logs into
``$OUT``. Back here, with the returned folder (the device tool's ``files_at``)::

    python -m nopelib.studies.campaign_gpu --merge-from <folder> [--out-dir book/results]

merges them as the sitting would have written them here: a study file's runs of the seeds the
local file lacks (``trained_study.grown``: a run the CPU campaign finished meanwhile is kept),
the ledger's records it lacks, each file's digest in the local manifest; then ``git add`` and
commit the files it names. A file copied by hand instead is refused until signed
(``python -m nopelib.results.files --sign FILE``). Merge while no campaign from a clone older
than this module writes the ledger: its schema refuses more than 2 streams.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from nopelib.results import files as results, guard
from nopelib.studies.campaign import LEDGER, PROFILE
from nopelib.studies.trained_study import grown
from nopelib.training.profiles import get_profile

CACHE = "/tmp/nopelib_cache"  # the GPU machine's run cache: checkpoints and the runs' logs
CAMPAIGN = "python3 -m nopelib.studies.campaign --device cuda --streams 5 --until 9m"
COMMAND = (f"export PYTHONUNBUFFERED=1 NOPELIB_CACHE_DIR={CACHE}; touch /tmp/t0; "
           "nvidia-smi -L; "
           f"timeout 585 {CAMPAIGN} --out-dir book/results 2>&1 | tee $OUT/campaign.log; "
           "find book/results -maxdepth 1 -newer /tmp/t0 -name '*.json' -exec cp {} $OUT/ \\; ; "
           f"tar czf $OUT/logs.tar.gz -C {CACHE} campaign_logs; ls -l $OUT")
MAX_COMMAND = 2000  # characters the device tool takes


def merge_back(src: Path, out_dir: Path) -> list[Path]:
    """Merge the study files and the ledger in ``src`` (a GPU sitting's) into ``out_dir``:
    the runs of seeds its files lack, the ledger records it lacks; the files written."""
    training = json.loads(json.dumps(get_profile(PROFILE).record()))  # as a file holds it
    written = []
    for path in sorted(src.glob(f"trained_{PROFILE}_*.json")):
        out = out_dir / path.name

        def runs_of(old: dict | None, new: dict, out: Path = out) -> dict:
            seeds = {r["seed"] for r in old["runs"]} if old else set()
            if old and not {r["seed"] for r in new["runs"]} - seeds:
                return old  # nothing new: the file stays as it is
            return grown(out, old, new, training, ())
        results.write(out, results.load(path), "trained", merge=runs_of)
        written.append(out)
    if (src / LEDGER).is_file():
        def records_of(old: dict | None, new: dict) -> dict:
            runs = old["runs"] if old else []
            have = {(r["key"], r["started"]) for r in runs}
            fresh = [r for r in new["runs"] if (r["key"], r["started"]) not in have]
            return {**new, "runs": runs + fresh} if fresh or not old else old
        results.write(out_dir / LEDGER, results.load(src / LEDGER), "campaign", records_of)
        written.append(out_dir / LEDGER)
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m nopelib.studies.campaign_gpu", description=__doc__.split("\n\n")[0],
        epilog="Without --merge-from it prints COMMAND, the line a device session runs "
               "(timeout_s 600); its files come back in the tool's files_at folder.")
    parser.add_argument("--merge-from", type=Path, metavar="DIR",
                        help="the folder of the files a GPU sitting returned")
    parser.add_argument("--out-dir", type=Path, default=results.RESULTS_DIR,
                        help="the folder to merge them into (default book/results)")
    args = parser.parse_args(argv)
    if args.merge_from is None:
        print(COMMAND)
        return
    if not args.merge_from.is_dir():
        parser.error(f"--merge-from={str(args.merge_from)!r} is not allowed: an existing "
                     "folder")
    if not args.out_dir.is_dir() or args.out_dir.resolve() == args.merge_from.resolve():
        parser.error(f"--out-dir={str(args.out_dir)!r} is not allowed: an existing folder "
                     "other than --merge-from")
    try:
        written = merge_back(args.merge_from, args.out_dir)
    except (results.ResultsError, guard.Refused) as exc:
        parser.error(f"--merge-from={str(args.merge_from)!r}: {exc} (nothing more merged)")
    for path in written:
        print(f"merged {path}")
    if not written:
        print(f"nothing to merge in {args.merge_from}")


if __name__ == "__main__":
    main()
