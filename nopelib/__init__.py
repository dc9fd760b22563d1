"""nopelib: the model, tasks, metrics, training and probes of the NoPE adjacency replication.

The package is in wings, lowest first; a module imports from its own wing and the ones below,
never from one above (``tests/test_house.py`` checks it):

- ``store``: cache folders, run checkpoints, the chapters' results cache, how keys see the code
- ``core``: the model, the tasks, the metrics, the probes, statistics, random models measured
- ``averaging``: the averaging theory, at initialisation and along training, beside block 1
- ``rules``: the paper's claims as decision rules
- ``training``: profiles, the training loop, the run cache, launchers, the time gate
- ``results``: the committed result files: their schemas, checks, loading and writing
- ``studies``: the study commands, each run by hand with ``python -m``
- ``book``: the chapters' specs, figures and the scorecard
- ``tools``: the benchmark

The core needs only torch, numpy, pandas and numba; plotting lives in ``nopelib.book.viz`` and
is imported only by code that draws.
"""

import nopelib.store.cache  # noqa: F401  (first: points numba's cache out of the package)

__version__ = "0.1.0"
