"""nopelib: the model, tasks, metrics, training and probes of the NoPE adjacency replication.

The core (model, tasks, metrics, analysis) needs only torch, numpy, pandas and numba; plotting
lives in ``nopelib.viz`` and is imported only by code that draws.
"""

import nopelib.cache  # noqa: F401  (first: points numba's cache out of the package)
from nopelib.model import GPT, GPTConfig
from nopelib.tasks import TASKS

__all__ = ["GPT", "GPTConfig", "TASKS"]
__version__ = "0.1.0"
