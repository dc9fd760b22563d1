"""The text-length study under two CPU kernel sets: a verdict stands only where both agree.

Fixed before the study's rerun under the second kernel set ran. Float kernels differ between
CPUs (AVX-512, AVX2, torch's plain ones), and training turns their last bits into other
weights: the same seed gives another model. A verdict is the study's only if it survives that.
So the study is trained twice on one machine, each time in a cache of its own: natively
(``length_text.json``) and with ``ATEN_CPU_CAPABILITY=avx2`` (``=default`` on a CPU whose best
is AVX2) plus ``MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2``
(``length_text_avx2.json``), the same encodings and seeds in both.

Each test of ``length_claims`` (one claim, reading, group and layer) keeps its verdict where
the two sets give the same one and becomes "cannot tell" where they differ: the rule's margin
is then inside the kernels' spread. Readings combine the tests as before, and ``explains``
reads the combined tests. This can only withdraw a verdict, never give one. Until the rerun
holds every seed the native file holds, the verdicts are the native set's alone, and say so.
"""

from __future__ import annotations

import pandas as pd

TEST_KEYS = ["claim", "reading", "group", "layer"]  # one test of length_claims
KERNEL_FILE = "length_text_avx2.json"  # the rerun under the second kernel set
KERNEL_RULE = ("a test's verdict stands where the native and the second kernel set's runs "
               "(the same encodings and seeds) give the same one, else 'cannot tell'; it can "
               "only withdraw a verdict")


def across_kernels(native: pd.DataFrame, other: pd.DataFrame) -> pd.DataFrame:
    """``length_claims``'s tests of the native runs with each verdict replaced by its verdict
    under both kernel sets (``other``: the same tests of the rerun): kept where they agree,
    "cannot tell" where they differ. Adds ``verdict_native``, ``verdict_other`` and
    ``kernels`` ("agree" or "differ"); the bounds shown stay the native runs'."""
    mine, theirs = (set(map(tuple, t[TEST_KEYS].astype(str).values)) for t in (native, other))
    if mine != theirs:
        raise ValueError(f"across_kernels: the two kernel sets' tests differ "
                         f"({len(mine ^ theirs)} tests in one only); allowed: the same "
                         "encodings, seeds and lengths under both")
    both = native.merge(other[TEST_KEYS + ["verdict"]], on=TEST_KEYS, how="left",
                        suffixes=("", "_other"), validate="one_to_one")
    agree = both.verdict == both.verdict_other
    both["verdict_native"] = both.verdict
    both["kernels"] = agree.map({True: "agree", False: "differ"})
    both["verdict"] = both.verdict.where(agree, "cannot tell")
    return both
