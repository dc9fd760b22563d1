"""nopelib: the model, tasks, metrics, training and probes of the NoPE adjacency replication.

The package is in wings, lowest first; a module imports from its own wing and the ones below,
never from one above (``tests/test_house.py`` checks it):

- ``store``: cache folders, run checkpoints, the chapters' results cache, how keys see the code
- ``core``: the model, the tasks, the metrics, the probes, statistics, input checks
- ``averaging``: the averaging theory, at initialisation and along training
- ``rules``: the paper's claims as decision rules
- ``training``: profiles, the training loop, the run cache, launchers, the time gate
- ``studies``: what the chapters compute and the committed result files
- ``book``: the chapters' specs, figures and the scorecard
- ``tools``: the benchmark and the CPU-kernel check

The core needs only torch, numpy, pandas and numba; plotting lives in ``nopelib.book.viz`` and
is imported only by code that draws.
"""

import nopelib.store.cache  # noqa: F401  (first: points numba's cache out of the package)

__version__ = "0.1.0"
