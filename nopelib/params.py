"""Checks of a chapter's parameters, run in the cell after ``parameters`` before any work.

A chapter rerun with papermill (``-p NAME VALUE``) should fail in seconds on a bad value, with
one message per bad parameter naming it, its value and what is allowed, instead of after
minutes of earlier studies with an error from deep inside pandas or torch. A chapter declares
what it accepts as a dict of rules and calls ``check_params(SPEC, globals())``:

    SPEC = {"n_seeds": Int(min=1), "tasks": ListOf(Choice(TASKS), unique=True)}
    check_params(SPEC, globals())

Types are checked exactly: papermill's ``-p`` passes a list as a string (``-p tasks
'["nope"]'`` arrives as the text ``["nope"]``), which a loop would otherwise take apart letter
by letter; the error says to pass lists with ``-y``.

``check_training_time`` guards the chapters that train: a profile expected to take over an hour
on the CPU (the paper profile) is refused unless ``NOPELIB_ALLOW_SLOW=1`` is set, in which
case it only warns with the expected time. An opt-in rather than a bare warning, because a
warning scrolls past while the kernel trains for days.
"""

from __future__ import annotations

import math
import numbers
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

ALLOW_SLOW_ENV = "NOPELIB_ALLOW_SLOW"
SLOW_HOURS = 1.0  # CPU training expected to take longer than this needs the opt-in

# (predicate over the value and all parameters, what it allows): extra conditions of a rule
Condition = tuple[Callable[[Any, Mapping[str, Any]], bool], str]


@dataclass(frozen=True)
class Rule:
    """What one parameter accepts: a base check (``_problem``) plus extra conditions."""

    conditions: tuple[Condition, ...] = field(default=(), kw_only=True)

    def allowed(self) -> str:
        raise NotImplementedError

    def describe(self) -> str:
        """What is allowed, with the extra conditions."""
        return " and ".join([self.allowed(), *(text for _, text in self.conditions)])

    def _ok(self, value: Any) -> bool:
        raise NotImplementedError

    def where(self, predicate: Callable[[Any, Mapping[str, Any]], bool], text: str) -> "Rule":
        """This rule with one more condition, which may look at the other parameters."""
        return replace(self, conditions=(*self.conditions, (predicate, text)))

    def problem(self, value: Any, params: Mapping[str, Any]) -> str | None:
        """None if ``value`` is allowed, else what is allowed."""
        if not self._ok(value):
            return self.allowed()
        for predicate, text in self.conditions:
            try:
                ok = predicate(value, params)
            except Exception:  # noqa: BLE001  (a condition on another, bad parameter)
                ok = False
            if not ok:
                return text
        return None


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


@dataclass(frozen=True)
class Int(Rule):
    """An integer (not a bool) in [min, max]."""

    min: int | None = None
    max: int | None = None

    def allowed(self) -> str:
        lo = "" if self.min is None else f" >= {self.min}"
        hi = "" if self.max is None else f" <= {self.max}"
        return f"an integer{lo}{' and' if lo and hi else ''}{hi}"

    def _ok(self, value: Any) -> bool:
        return (_is_int(value) and (self.min is None or value >= self.min)
                and (self.max is None or value <= self.max))


@dataclass(frozen=True)
class Float(Rule):
    """A finite real number in [min, max] (or (min, max) where ``open``)."""

    min: float | None = None
    max: float | None = None
    open: bool = False

    def allowed(self) -> str:
        lo = "" if self.min is None else f" {'>' if self.open else '>='} {self.min}"
        hi = "" if self.max is None else f" {'<' if self.open else '<='} {self.max}"
        return f"a finite number{lo}{' and' if lo and hi else ''}{hi}"

    def _ok(self, value: Any) -> bool:
        if not _is_real(value) or not math.isfinite(value):
            return False
        if self.min is not None and (value <= self.min if self.open else value < self.min):
            return False
        return self.max is None or (value < self.max if self.open else value <= self.max)


@dataclass(frozen=True)
class Choice(Rule):
    """One of a fixed set of values."""

    options: Sequence[Any] = ()

    def allowed(self) -> str:
        return f"one of {sorted(self.options, key=repr)}"

    def _ok(self, value: Any) -> bool:
        return isinstance(value, (str, int, float)) and value in self.options


@dataclass(frozen=True)
class Optional(Rule):
    """None, or what ``rule`` allows."""

    rule: Rule = field(default_factory=Int)

    def allowed(self) -> str:
        return f"None or {self.rule.describe()}"

    def _ok(self, value: Any) -> bool:
        return value is None or self.rule.problem(value, {}) is None


@dataclass(frozen=True)
class ListOf(Rule):
    """A list (or tuple) of ``min_len`` or more items that ``item`` allows."""

    item: Rule = field(default_factory=Int)
    min_len: int = 1
    unique: bool = False

    def allowed(self) -> str:
        unique = ", no repeats" if self.unique else ""
        return (f"a list of at least {self.min_len} item(s), each {self.item.describe()}{unique} "
                "(papermill: pass lists with -y, e.g. -y 'name: [1, 2]')")

    def _ok(self, value: Any) -> bool:
        if not isinstance(value, (list, tuple)) or len(value) < self.min_len:
            return False
        if self.unique and len(set(map(repr, value))) != len(value):
            return False
        return all(self.item.problem(v, {}) is None for v in value)


@dataclass(frozen=True)
class Device(Rule):
    """A device name that ``nopelib.train.resolve_device`` accepts on this machine."""

    def allowed(self) -> str:
        return "'auto', 'cpu', 'cuda', 'cuda:N' or 'mps', available on this machine"

    def _ok(self, value: Any) -> bool:
        from nopelib.train import resolve_device  # torch: imported only when a chapter asks

        try:
            resolve_device(value)
        except (ValueError, RuntimeError, AttributeError):
            return False
        return True


def check_params(spec: Mapping[str, Rule], params: Mapping[str, Any]) -> None:
    """Raise one ValueError listing every parameter in ``spec`` whose value in ``params`` (a
    chapter's ``globals()``) is not allowed: name, value, and what is allowed."""
    problems = []
    for name, rule in spec.items():
        if name not in params:
            problems.append(f"{name} is missing")
            continue
        why = rule.problem(params[name], params)
        if why is not None:
            problems.append(f"{name}={params[name]!r} is not allowed: {why}")
    if problems:
        raise ValueError("bad parameter(s):\n  " + "\n  ".join(problems))


def check_training_time(profile: Any, n_runs: int, device: str = "auto") -> None:
    """Refuse, before any work, CPU training expected to take over SLOW_HOURS, unless
    $NOPELIB_ALLOW_SLOW=1 (then warn with the expected time). ``profile`` is a profile name or a
    ``TrainProfile``; the estimate is ``train.expected_cpu_seconds`` on one process per core."""
    from nopelib.train import expected_cpu_seconds, get_profile, resolve_device

    if resolve_device(device).type != "cpu" or n_runs < 1:
        return
    prof = get_profile(profile)
    hours = expected_cpu_seconds(prof) * math.ceil(n_runs / (os.cpu_count() or 1)) / 3600
    if hours <= SLOW_HOURS:
        return
    message = (f"profile={prof.name!r} trains {n_runs} run(s) on the CPU in about {hours:.0f} h "
               f"({os.cpu_count()} cores)")
    if os.environ.get(ALLOW_SLOW_ENV) == "1":
        warnings.warn(message, stacklevel=2)
        return
    raise ValueError(f"bad parameter(s):\n  {message}; allowed: a GPU (device='cuda'), profile "
                     f"'cpu', or set {ALLOW_SLOW_ENV}=1 to train on the CPU anyway")
