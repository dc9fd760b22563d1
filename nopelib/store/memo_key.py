"""How a memoised call is keyed: the function, what it reads, its arguments, and the code.

A call is identified by its content, not by names (see ``nopelib.store.memo``): the function's
module, qualified name and source, the instance a bound method is bound to, every argument by
the bytes of its values, what a notebook function reads besides its arguments, the nopelib code
it depends on (``code_hash``: import closures, each module by its syntax, through
``nopelib.store.sources``), and the torch, numpy and pandas versions.
"""

from __future__ import annotations

import dataclasses
import dis
import hashlib
import inspect
import re
import sys
import types
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pandas as pd
import torch

from nopelib.store import sources

# The instance layout of a plain Python class: one whose state is all in its __dict__
_PLAIN_BASICSIZE = type("_Plain", (), {}).__basicsize__


def package_hash() -> str:
    """SHA-256 of every nopelib source file, each by its syntax (``sources.source_hash``)."""
    return sources.source_hash()


def _named(obj: Any) -> str:
    """A function's or class's dotted name as keys record it (``sources.key_name``)."""
    return sources.key_name(f"{obj.__module__}.{obj.__qualname__}")


class _Recording:
    """A hash that also notes the dotted names of the nopelib objects fed to it by name
    (``module:``, ``defined:``, ``class:``, ``dataclass:``, ``instance:``): the code a key's
    value depends on besides the called function's own module."""

    _NAMED = re.compile(r"(?:module|defined|class|dataclass|instance):(nopelib(?:\.\w+)*)")

    def __init__(self) -> None:
        self.h = hashlib.sha256()
        self.names: set[str] = set()

    def update(self, data: bytes) -> None:
        self.h.update(data)
        if len(data) < 4096:  # names come in short updates; arrays in long ones
            self.names.update(self._NAMED.findall(data.decode("latin-1")))

    def hexdigest(self) -> str:
        return self.h.hexdigest()


def code_hash(fn: Callable[..., Any], named: set[str]) -> str:
    """The source hash a call of ``fn`` is keyed by: the import closure of ``fn``'s module
    and of the nopelib modules it was fed by name (``named``), so editing a module changes the
    keys of the studies that import it and no others. A function of a module outside nopelib
    other than a notebook's (a script, a test) may call nopelib through imports no key sees:
    it gets the whole package."""
    module = getattr(fn, "__module__", None) or "?"
    if module.split(".")[0] != sources.PACKAGE and module != "__main__":
        return package_hash()
    return sources.module_closure_hash({module, *named})


def _feed(h: _Recording, obj: Any, where: str) -> None:
    """Add an unambiguous encoding of ``obj`` to ``h``; ``where`` names it in errors."""
    if isinstance(obj, np.generic):  # before float: np.float64 is a float, and 0.5 is no float32
        h.update(f"scalar:{obj.dtype.str}:{obj.tobytes().hex()};".encode())
    elif obj is None or isinstance(obj, (bool, int, float, str, bytes)):
        h.update(f"{type(obj).__name__}:{obj!r};".encode())
    elif isinstance(obj, (list, tuple)):
        h.update(f"{type(obj).__name__}[{len(obj)}](".encode())
        for i, item in enumerate(obj):
            _feed(h, item, f"{where}[{i}]")
        h.update(b")")
    elif isinstance(obj, Mapping):
        h.update(f"map[{len(obj)}](".encode())
        for key in sorted(obj, key=repr):
            _feed(h, key, f"{where} key")
            _feed(h, obj[key], f"{where}[{key!r}]")
        h.update(b")")
    elif isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        h.update(f"tensor:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(obj, np.ndarray):
        h.update(f"array:{obj.dtype.str}:{obj.shape};".encode())
        h.update(np.ascontiguousarray(obj).tobytes())
    elif isinstance(obj, torch.nn.Module):
        h.update(f"module:{_named(type(obj))}:training={obj.training};".encode())
        if dataclasses.is_dataclass(getattr(obj, "config", None)):
            _feed(h, obj.config, f"{where}.config")
        _feed(h, dict(obj.state_dict()), f"{where}.state_dict()")
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        h.update(f"dataclass:{_named(type(obj))}".encode())
        _feed(h, {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}, where)
    else:
        raise TypeError(f"{where} has type {type(obj).__name__}, which memo cannot fingerprint; allowed: "
                        "None, bool, int, float, str, bytes, list, tuple, dict, numpy arrays and scalars, "
                        "torch tensors, torch modules, dataclasses")


def _is_plain_instance(obj: Any) -> bool:
    """Whether all of ``obj``'s state is in its ``__dict__``: an instance of Python classes with
    no slots and no C base (a C base, e.g. random.Random's, keeps state that vars() misses)."""
    cls = type(obj)
    return (hasattr(obj, "__dict__") and cls.__basicsize__ == _PLAIN_BASICSIZE
            and cls.__itemsize__ == 0 and not any("__slots__" in vars(c) for c in cls.__mro__))


def _feed_bound(h: _Recording, obj: Any, where: str) -> None:
    """The instance a method is bound to (``fn.__self__``): a method's result depends on it."""
    if isinstance(obj, types.ModuleType):  # a builtin function's __self__ is its module
        h.update(f"module:{sources.key_name(obj.__name__)};".encode())
    elif isinstance(obj, type):  # a classmethod: which class (a subclass) it was called on
        h.update(f"class:{_named(obj)};".encode())
    elif (_is_plain_instance(obj) and not dataclasses.is_dataclass(obj)
          and not isinstance(obj, torch.nn.Module)):
        h.update(f"instance:{_named(type(obj))}".encode())
        _feed(h, vars(obj), f"{where}.__dict__")
    else:
        _feed(h, obj, where)


def _code_fingerprint(code: types.CodeType) -> str:
    """The code object's instructions, names and constants, without file names or line numbers
    (which change every time a notebook cell runs)."""
    consts = [_code_fingerprint(c) if isinstance(c, types.CodeType) else repr(c) for c in code.co_consts]
    return f"{code.co_code.hex()}|{code.co_names}|{code.co_varnames}|{consts}"


def function_fingerprint(fn: Callable[..., Any]) -> str:
    """What ``fn`` does, as text: its source where Python can find it (modules, notebook cells),
    else its bytecode. Part of the key, so that editing a function defined in a notebook
    (``__main__``, outside the hashed package) computes afresh."""
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        code = getattr(fn, "__code__", None)
        return _code_fingerprint(code) if code is not None else repr(fn)


def _global_names(code: types.CodeType) -> set[str]:
    """The globals that ``code`` and the code nested in it (functions, lambdas, comprehensions)
    load. The load instructions, not ``co_names``, which also holds every attribute name."""
    names = {ins.argval for ins in dis.get_instructions(code) if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def _in_importable_module(obj: Any) -> bool:
    """Whether ``obj`` is a function or class (not an instance, nor a method bound to one)
    defined in a module that ``import`` finds, so that its source names it."""
    module = getattr(obj, "__module__", None)
    bound = getattr(obj, "__self__", None)
    # __qualname__ on the object itself: classes and functions have one, instances do not
    return (callable(obj) and isinstance(getattr(obj, "__qualname__", None), str)
            and isinstance(module, str) and module != "__main__" and module in sys.modules
            and (bound is None or isinstance(bound, types.ModuleType)))


def _feed_read_value(h: _Recording, value: Any, where: str, seen: set[int]) -> None:
    """A value a notebook function reads besides its arguments (a global, default or free
    variable): modules and importable functions or classes by name, notebook functions by
    source and what they read, anything else by value."""
    if isinstance(value, types.ModuleType):
        h.update(f"module:{sources.key_name(value.__name__)};".encode())
    elif _in_importable_module(value):
        h.update(f"defined:{_named(value)};".encode())
    elif isinstance(value, (types.FunctionType, types.MethodType)):
        _feed_function(h, value, where, seen)
    else:
        _feed(h, value, where)


def _feed_function(h: _Recording, fn: Callable[..., Any], where: str, seen: set[int]) -> None:
    """What ``fn`` computes besides its arguments (see the module docstring); ``seen`` holds the
    notebook functions already fed, so that recursive ones end."""
    h.update(function_fingerprint(fn).encode() + b"\0")
    bound = getattr(fn, "__self__", None)
    if bound is not None:
        _feed_bound(h, bound, f"{where}.__self__")
    func = getattr(fn, "__func__", fn)
    if not isinstance(func, types.FunctionType) or _in_importable_module(func) or id(func) in seen:
        return
    seen.add(id(func))
    code = func.__code__
    read = {f"default {i}": v for i, v in enumerate(func.__defaults__ or ())}
    read |= {f"default {k!r}": v for k, v in (func.__kwdefaults__ or {}).items()}
    read |= {f"free variable {n!r}": cell.cell_contents
             for n, cell in zip(code.co_freevars, func.__closure__ or ())}
    # a name missing from the globals is a builtin or a NameError when fn runs
    read |= {f"global {n!r}": func.__globals__[n]
             for n in sorted(_global_names(code)) if n in func.__globals__}
    for label, value in read.items():
        h.update(f"{label}=".encode())
        _feed_read_value(h, value, f"{label} read by {func.__qualname__}", seen)


def call_key(fn: Callable[..., Any], args: tuple, kwargs: dict) -> str:
    """The content hash that identifies ``fn(*args, **kwargs)`` (see the module docstring)."""
    name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', '?')}"
    keyed = sources.key_name(name)  # a nopelib module by its name, not its wing
    if "<lambda>" in name or "<locals>" in name:
        raise ValueError(f"fn={name!r} must be a module-level function: a lambda or local function "
                         "has no stable identity to cache under")
    h = _Recording()
    h.update(f"{keyed};torch {torch.__version__};numpy {np.__version__};"
             f"pandas {pd.__version__};".encode())
    _feed_function(h, fn, name, set())
    _feed(h, list(args), "args")
    _feed(h, kwargs, "kwargs")
    h.update(f"source {code_hash(fn, h.names)};".encode())
    return h.hexdigest()[:40]
