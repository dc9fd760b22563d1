"""What work costs before it runs: the refusal of work expected to take over an hour.

A parameter's rule may carry a ``Cost`` (``params.Rule.costing``): the product of several
parameters' sizes times the seconds one unit takes. Work expected to take over SLOW_HOURS is
refused with the estimate and the ways out, unless ``NOPELIB_ALLOW_SLOW=1`` turns the refusal
into a warning (``slow_refusal``).
"""

from __future__ import annotations

import math
import numbers
import os
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nopelib.core.model import GPTConfig

ALLOW_SLOW_ENV = "NOPELIB_ALLOW_SLOW"
SLOW_HOURS = 1.0  # CPU training expected to take longer than this needs the opt-in


def is_real(value: Any) -> bool:
    """A real number, and not a bool (which Python counts as one)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def size_of(value: Any) -> float:
    """A size parameter's count: a list's items, or the number itself."""
    if isinstance(value, (list, tuple)):
        return len(value)
    if not is_real(value):
        raise TypeError(f"{value!r} is not a size")
    return value


def model_params(config: GPTConfig) -> int:
    """The parameter count of ``GPT(config)`` (the tied head counted once), from the config's
    shapes alone: building the model, even on torch's meta device, runs every layer's
    initialiser, and a refusal that prices a grid of nine models must answer within a second
    (tests/core/test_model.py checks this count against the model's own)."""
    d, bias = config.n_embd, int(config.bias)
    linears = 3 * d * d + d * d + 4 * d * d + 4 * d * d  # q/k/v, attention out, MLP in and out
    linear_biases = bias * (3 * d + d + 4 * d + d)
    layer_norms = 2 * (d + bias * d)  # ln_1, ln_2: a weight and (with bias) a bias each
    blocks = config.n_layer * (linears + linear_biases + layer_norms)
    learned = config.block_size * d if config.pos_encoding == "learned" else 0
    return config.vocab_size * d + learned + blocks + d + bias * d  # embeddings, ln_f


def hours_text(hours: float) -> str:
    """Hours as a refusal shows them: one decimal under ten."""
    return f"{hours:,.1f}" if hours < 10 else f"{hours:,.0f}"


def slow_refusal(message: str, allowed: str) -> str | None:
    """The refusal of work expected to take over an hour (``message`` says how long), or None
    after a warning where ``$NOPELIB_ALLOW_SLOW=1`` opts in."""
    if os.environ.get(ALLOW_SLOW_ENV) == "1":
        warnings.warn(message, stacklevel=4)
        return None
    return f"{message}; allowed: {allowed}, or set {ALLOW_SLOW_ENV}=1 to run it anyway"


@dataclass(frozen=True)
class Cost:
    """What several parameters cost together: the product of their sizes (a list counts its
    items) and of ``scale`` (a further factor, named by ``scale_text``), each unit taking
    ``seconds_each`` (``each`` says what a unit is and where its time comes from). Over
    ``max_hours`` it is refused with the estimate, unless ``$NOPELIB_ALLOW_SLOW=1``. It is
    attached to one of the parameters' rules (``Rule.costing``); a command's names its sizes
    by flag (``"--seeds"``), as ``check_args`` passes them."""

    sizes: tuple[str, ...]
    seconds_each: float
    each: str
    scale: Callable[[Mapping[str, Any]], float] | None = None
    scale_text: str = ""
    max_hours: float = SLOW_HOURS

    def problem(self, params: Mapping[str, Any]) -> str | None:
        """None within the bound (or where a size is itself bad: its own rule names it),
        else the product, its estimate and what is allowed."""
        try:
            factors = [size_of(params[name]) for name in self.sizes]
            if self.scale is not None:
                factors.append(float(self.scale(params)))
        except (KeyError, TypeError, ValueError):
            return None
        units = math.prod(factors)
        seconds = units * self.seconds_each
        if seconds <= self.max_hours * 3600:
            return None
        names = " x ".join([*self.sizes, *([self.scale_text] if self.scale else [])])
        shown = " x ".join(f"{f:,.3g}" if isinstance(f, float) else f"{f:,}" for f in factors)
        limit = self.max_hours * 3600 / self.seconds_each
        return slow_refusal(f"{names} = {shown} = {units:,.0f} unit(s) of {self.each}: about "
                            f"{hours_text(seconds / 3600)} h", f"at most {self.max_hours:g} h "
                            f"({limit:,.0f} units)")
