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

A name in the chapter's globals that the spec does not know, and that looks injected (plain
data: papermill's ``-p profil paper`` only warns "Passed unknown parameter" and the chapter would
run with its defaults), is refused too, with the closest known name. Size parameters carry upper
bounds with the time or memory they stand for (``why=``), so ``n_seeds=10**9`` fails at once
instead of running for days; seeds are integers in [0, 2**32 - 1] (``SEED``).

Bounds per parameter let several parameters at their separate maxima run for hours together,
so a rule may also carry a ``Cost`` (``Rule.costing``): the product of sizes (``n_seeds x
inputs_per_task``) times the seconds one unit takes, refused over an hour with the estimate.

``check_args`` applies the same rules to a command's arguments (``parser.error``: exit code 2
before any work; a rule may read the other flags' values, keyed by flag), and ``OutPath``
refuses an output path that cannot be written later.

``check_training_time`` guards the chapters and commands that train: training expected to take
over an hour on the CPU (the paper profile) is refused unless ``NOPELIB_ALLOW_SLOW=1`` is set,
in which case it only warns with the expected time; so is a ``Cost`` over its bound. An opt-in
rather than a bare warning, because a warning scrolls past while the kernel trains for days.
"""

from __future__ import annotations

import argparse
import difflib
import math
import numbers
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePath
from typing import Any
from nopelib.core.cost import Cost, is_real

SEED_MAX = 2**32 - 1  # numpy's default_rng and torch.manual_seed both take 32-bit seeds
# names IPython and ipykernel put in a kernel's globals: In and Out are plain data, not parameters
KERNEL_NAMES = frozenset({"In", "Out", "get_ipython", "exit", "quit", "open"})

# (predicate over the value and all parameters, what it allows): extra conditions of a rule
Condition = tuple[Callable[[Any, Mapping[str, Any]], bool], str]


@dataclass(frozen=True)
class Rule:
    """What one parameter accepts: a base check (``_ok``) plus extra conditions and joint
    costs (``Cost``: what it costs with other parameters); ``why`` says where a bound comes
    from (the time or memory it stands for) and is shown with it."""

    conditions: tuple[Condition, ...] = field(default=(), kw_only=True)
    costs: tuple[Cost, ...] = field(default=(), kw_only=True)
    why: str = field(default="", kw_only=True)

    def allowed(self) -> str:
        """What the base check allows, with ``why``."""
        raise NotImplementedError

    def _reason(self) -> str:
        return f" ({self.why})" if self.why else ""

    def describe(self) -> str:
        """What is allowed, with the extra conditions."""
        return " and ".join([self.allowed(), *(text for _, text in self.conditions)])

    def _ok(self, value: Any) -> bool:
        raise NotImplementedError

    def where(self, predicate: Callable[[Any, Mapping[str, Any]], bool], text: str) -> "Rule":
        """This rule with one more condition, which may look at the other parameters."""
        return replace(self, conditions=(*self.conditions, (predicate, text)))

    def costing(self, cost: Cost) -> "Rule":
        """This rule with one more joint cost over the parameters, bounded."""
        return replace(self, costs=(*self.costs, cost))

    def problem(self, value: Any, params: Mapping[str, Any]) -> str | None:
        """None if ``value`` is allowed, else what is allowed."""
        if not self._ok(value):
            return self.allowed()
        return self.joint_problem(value, params)

    def joint_problem(self, value: Any, params: Mapping[str, Any]) -> str | None:
        """The first extra condition that ``value`` fails or cost over its bound (the base
        check aside), or None."""
        failed = (text for predicate, text in self.conditions
                  if not _holds(predicate, value, params))
        over = (why for cost in self.costs if (why := cost.problem(params)) is not None)
        return next(failed, None) or next(over, None)


def _holds(predicate: Callable[[Any, Mapping[str, Any]], bool], value: Any,
           params: Mapping[str, Any]) -> bool:
    try:
        return bool(predicate(value, params))
    except Exception:  # noqa: BLE001  (a condition on another, bad parameter)
        return False


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


@dataclass(frozen=True)
class Int(Rule):
    """An integer (not a bool) in [min, max]."""

    min: int | None = None
    max: int | None = None

    def allowed(self) -> str:
        lo = "" if self.min is None else f" >= {self.min}"
        hi = "" if self.max is None else f" <= {self.max}"
        return f"an integer{lo}{' and' if lo and hi else ''}{hi}{self._reason()}"

    def _ok(self, value: Any) -> bool:
        return (_is_int(value) and (self.min is None or value >= self.min)
                and (self.max is None or value <= self.max))


@dataclass(frozen=True)
class Float(Rule):
    """A finite real number in [min, max] (or (min, max) where ``open``; (min, max] where
    ``open_min``)."""

    min: float | None = None
    max: float | None = None
    open: bool = False
    open_min: bool = False

    def allowed(self) -> str:
        above = self.open or self.open_min
        lo = "" if self.min is None else f" {'>' if above else '>='} {self.min}"
        hi = "" if self.max is None else f" {'<' if self.open else '<='} {self.max}"
        return f"a finite number{lo}{' and' if lo and hi else ''}{hi}{self._reason()}"

    def _ok(self, value: Any) -> bool:
        if not is_real(value) or not math.isfinite(value):
            return False
        above = self.open or self.open_min
        if self.min is not None and (value <= self.min if above else value < self.min):
            return False
        return self.max is None or (value < self.max if self.open else value <= self.max)


@dataclass(frozen=True)
class Choice(Rule):
    """One of a fixed set of values."""

    options: Sequence[Any] = ()

    def allowed(self) -> str:
        return f"one of {sorted(self.options, key=repr)}{self._reason()}"

    def _ok(self, value: Any) -> bool:
        return isinstance(value, (str, int, float)) and value in self.options


@dataclass(frozen=True)
class Optional(Rule):
    """None, or what ``rule`` allows."""

    rule: Rule = field(default_factory=Int)

    def allowed(self) -> str:
        return f"None or {self.rule.describe()}{self._reason()}"

    def _ok(self, value: Any) -> bool:
        return value is None or self.rule.problem(value, {}) is None


@dataclass(frozen=True)
class ListOf(Rule):
    """A list (or tuple) of ``min_len`` to ``max_len`` items that ``item`` allows; ``why`` is the
    reason for ``max_len``."""

    item: Rule = field(default_factory=Int)
    min_len: int = 1
    unique: bool = False
    max_len: int | None = None

    def allowed(self) -> str:
        count = (f"at least {self.min_len}" if self.max_len is None
                 else f"{self.min_len} to {self.max_len}")
        unique = ", no repeats" if self.unique else ""
        return (f"a list of {count} item(s){self._reason()}, each {self.item.describe()}{unique} "
                "(papermill: pass lists with -y, e.g. -y 'name: [1, 2]')")

    def _ok(self, value: Any) -> bool:
        return (isinstance(value, (list, tuple)) and self.count_problem(value) is None
                and all(self.item.problem(v, {}) is None for v in value))

    def count_problem(self, values: Sequence[Any]) -> str | None:
        """None if ``values`` has an allowed count and no repeat where ``unique``, else what
        is wrong and what is allowed (a command's flag: its items are checked apart)."""
        n = len(values)
        if n < self.min_len or (self.max_len is not None and n > self.max_len):
            count = (f"at least {self.min_len}" if self.max_len is None
                     else f"{self.min_len} to {self.max_len}")
            return f"{n} value(s); allowed: {count}{self._reason()}"
        seen: set[str] = set()
        for value in values if self.unique else ():
            if repr(value) in seen:
                return f"{value!r} is given twice; allowed: no repeats"
            seen.add(repr(value))
        return None


@dataclass(frozen=True)
class Device(Rule):
    """A device name that ``nopelib.core.devices.resolve_device`` accepts on this machine."""

    def allowed(self) -> str:
        return ("'auto', 'cpu', 'cuda', 'cuda:N' or 'mps', available on this machine"
                f"{self._reason()}")

    def _ok(self, value: Any) -> bool:
        return self._unusable(value) is None

    @staticmethod
    def _unusable(value: Any) -> str | None:
        from nopelib.core.devices import resolve_device  # torch: imported only when a chapter asks

        try:
            resolve_device(value)
        except (ValueError, RuntimeError, AttributeError) as exc:
            return str(exc)
        return None

    def problem(self, value: Any, params: Mapping[str, Any]) -> str | None:
        """Why the device cannot be used (unknown, or absent here), then what is allowed."""
        why = super().problem(value, params)
        if why is not None and (reason := self._unusable(value)):
            return f"{reason.split('; allowed')[0]}; allowed: {why}"  # one list of what is allowed
        return why


# a seed of the chapters and commands; torch refuses 2**64 and more, 5 s into the work
SEED = Int(min=0, max=SEED_MAX,
           why="a 32-bit seed, which numpy's default_rng and torch.manual_seed both accept")


def _output_problem(path: Path, folder: bool) -> str | None:
    """Why ``path`` cannot be written later (as a file, or with ``folder`` as a folder), or
    None. Nothing is created: the nearest existing ancestor must be a writable folder."""
    if folder and path.exists() and not path.is_dir():
        return f"{path} exists and is not a folder"
    if not folder and path.is_dir():
        return f"{path} is an existing folder"
    ancestor = next(p for p in path.absolute().parents if os.path.lexists(p))
    if not ancestor.is_dir():
        return f"{ancestor} is not a folder, so nothing can be created under it"
    writable = path if folder and path.is_dir() else ancestor
    if not os.access(writable, os.W_OK | os.X_OK):
        return f"{writable} is not writable"
    return None


@dataclass(frozen=True)
class OutPath(Rule):
    """A path that a file (or with ``folder``, a folder) can be written to later: not an
    existing folder (not an existing file), under a writable folder; missing parent folders
    are fine, they are created when the output is written."""

    folder: bool = False

    def allowed(self) -> str:
        what = "a folder path (not a file)" if self.folder else "a file path (not a folder)"
        return f"{what} under a writable folder; missing folders are created{self._reason()}"

    def _ok(self, value: Any) -> bool:
        return isinstance(value, (str, PurePath))

    def problem(self, value: Any, params: Mapping[str, Any]) -> str | None:
        """The specific reason (which folder is a file or not writable), then what is allowed;
        then the extra conditions."""
        if not self._ok(value):
            return self.allowed()
        if bad := _output_problem(Path(value), self.folder):
            return f"{bad}; allowed: {self.allowed()}"
        return self.joint_problem(value, params)


def shown(value: Any, limit: int = 200) -> str:
    """``repr(value)``, cut short: a 20,000-item list should not fill the screen."""
    text = repr(value)
    if len(text) <= limit:
        return text
    size = f" ({len(value)} items)" if isinstance(value, (list, tuple, dict)) else ""
    return f"{text[:limit]}...{size}"


def _plain(value: Any) -> bool:
    """Whether papermill could have injected ``value``: a literal of strings, numbers, bools
    and None, or lists, tuples and dicts of them (a module, class, function, rule or a dict of
    tasks cannot be)."""
    if value is None or isinstance(value, (str, int, float)):  # bool is an int
        return True
    if isinstance(value, (list, tuple)):
        return all(map(_plain, value))
    if isinstance(value, dict):
        return all(_plain(k) and _plain(v) for k, v in value.items())
    return False


def _unknown(spec: Mapping[str, Rule], params: Mapping[str, Any]) -> list[str]:
    """One problem per name in ``params`` that looks like an injected parameter but is not
    in ``spec``, with the closest known name."""
    problems = []
    for name, value in params.items():
        if (name in spec or name.startswith("_") or name in KERNEL_NAMES or value is spec
                or not _plain(value)):
            continue
        close = difflib.get_close_matches(name, list(spec), n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"its parameters: {sorted(spec)}"
        problems.append(f"{name}={shown(value)} is not a parameter of this chapter; {hint}")
    return problems


def check_params(spec: Mapping[str, Rule], params: Mapping[str, Any]) -> None:
    """Raise one ValueError listing every parameter in ``spec`` whose value in ``params`` (a
    chapter's ``globals()``) is not allowed (name, value, and what is allowed), and every name
    in ``params`` that looks like an injected parameter but is not in ``spec``."""
    problems = []
    for name, rule in spec.items():
        if name not in params:
            problems.append(f"{name} is missing")
            continue
        why = rule.problem(params[name], params)
        if why is not None:
            problems.append(f"{name}={shown(params[name])} is not allowed: {why}")
    problems += _unknown(spec, params)
    if problems:
        raise ValueError("bad parameter(s):\n  " + "\n  ".join(problems))


def _shown_args(values: list[Any], limit: int = 200) -> str:
    """A flag's values as they were typed, cut short like ``_shown``."""
    text = " ".join(map(str, values))
    return text if len(text) <= limit else f"{text[:limit]}... ({len(values)} values)"


def _arg_problems(flag: str, value: Any, rule: Rule, flags: Mapping[str, Any]) -> list[str]:
    if isinstance(rule, ListOf) and isinstance(value, list):
        found = [f"{flag} {item} is not allowed: {why}" for item in value
                 if (why := rule.item.problem(item, flags)) is not None]
        for why in (rule.count_problem(value), rule.joint_problem(value, flags)):
            if why is not None:
                found.append(f"{flag} {_shown_args(value)} is not allowed: {why}")
        return found
    return [f"{flag} {item} is not allowed: {why}"
            for item in (value if isinstance(value, list) else [value])
            if item is not None and (why := rule.problem(item, flags)) is not None]


def check_args(parser: argparse.ArgumentParser, checks: Mapping[str, tuple[Any, Rule]]) -> None:
    """Exit through ``parser.error`` (code 2, before any work) naming every flag whose value
    its rule refuses, the value and what is allowed. ``checks`` maps a flag to (value, rule);
    a list (``nargs``) is checked item by item, or with a ``ListOf`` rule also as a whole (its
    count, repeats, conditions and costs); None (a flag left out) passes. Conditions and costs
    read the other flags' values keyed by flag (``"--T"``)."""
    flags = {flag: value for flag, (value, _) in checks.items()}
    problems = [why for flag, (value, rule) in checks.items()
                for why in _arg_problems(flag, value, rule, flags)]
    if problems:
        parser.error("\n  ".join(problems))
