"""How cache keys see the code: each module's syntax, and the modules a module imports.

A key must change when the code that produced an entry changes what it computes, and should
not change otherwise. So a source file counts by its syntax tree, not its bytes: comments,
docstrings, blank lines and line breaks do not reach a key (a comment edited in ``metrics``
keeps every trained run). And a module counts by its name without its folder: a nopelib import
is read as the module it binds (``from nopelib.core import model`` and ``from nopelib import
model`` both read "model"), so moving a module from one wing of the package to another keeps
every key, while importing another module, or another name, changes it.

``import_closure`` follows the ``import`` statements of the code (inside functions too)
through every subpackage, so no hand-kept list of files can fall behind the code; a package's
``__init__`` counts wherever one of its modules is imported, since importing runs it.
"""

from __future__ import annotations

import ast
import hashlib
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "nopelib"
PACKAGE_DIR = Path(__file__).resolve().parents[1]  # nopelib/, above this wing
# A source file modified this recently is read afresh on every call, not served from the
# per-process cache: file times tick in jiffies, so an edit within the tick that stamped the
# cached copy would otherwise go unseen (git's "racy" files)
RACY_SECONDS = 2.0


@dataclass(frozen=True)
class _Source:
    stamp: tuple[int, ...]  # (inode, size, mtime_ns, ctime_ns): any edit changes one of them
    digest: str  # SHA-256 of the normalised syntax tree
    empty: bool  # no statement but its docstring: a wing's __init__ computes nothing
    imports: tuple[str, ...]  # the package files it imports, relative to the package


_SOURCES: dict[Path, _Source] = {}  # per process: parsing a source's AST costs milliseconds


def module_file(module: str, root: Path | None = None) -> str | None:
    """The file of the dotted nopelib ``module`` relative to the package folder ("core/model.py",
    "core/__init__.py" for a subpackage), or None when it is not a module of the package."""
    parts = module.split(".")
    if parts[0] != PACKAGE:
        return None
    folder = PACKAGE_DIR if root is None else root
    rel = Path(*parts[1:]) if len(parts) > 1 else Path()
    for candidate in (rel.with_suffix(".py") if parts[1:] else None, rel / "__init__.py"):
        if candidate is not None and (folder / candidate).is_file():
            return candidate.as_posix()
    return None


def module_name(rel: str) -> str:
    """The name a package file counts under in a key: its module's last dotted part ("model"
    for "core/model.py", "core" for "core/__init__.py", the package's name for its own)."""
    parts = Path(rel).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return parts[-1] if parts else PACKAGE


def _packages(module: str) -> list[str]:
    """The packages that importing ``module`` runs: "nopelib", "nopelib.core", ..."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


class _Normalise(ast.NodeTransformer):
    """Docstrings dropped; every nopelib import replaced by the modules and names it binds,
    each module by its last dotted part; the package files imported collected in ``files``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.files: list[str] = []

    def _module(self, module: str) -> str | None:
        found = module_file(module, self.root)
        if found is not None:
            self.files += [f for p in _packages(module)
                           if (f := module_file(p, self.root)) is not None] + [found]
        return found

    def _drop_docstring(self, node: ast.AST) -> ast.AST:
        body = getattr(node, "body", None)
        if (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
        return self.generic_visit(node)

    visit_Module = visit_ClassDef = _drop_docstring
    visit_FunctionDef = visit_AsyncFunctionDef = _drop_docstring

    def visit_ImportFrom(self, node: ast.ImportFrom) -> ast.AST:
        if node.level or not node.module or node.module.split(".")[0] != PACKAGE:
            return node
        base = self._module(node.module)
        bound = []
        for alias in node.names:
            sub = f"{node.module}.{alias.name}"
            what = (f"module {module_name(self._module(sub))}" if module_file(sub, self.root)
                    else f"{module_name(base) if base else node.module} {alias.name}")
            bound.append(f"{what} as {alias.asname or alias.name}")
        return ast.Expr(ast.Constant("import " + ", ".join(bound)))

    def visit_Import(self, node: ast.Import) -> ast.AST:
        ours = [a for a in node.names if a.name.split(".")[0] == PACKAGE]
        if not ours:
            return node
        for alias in ours:
            self._module(alias.name)
        return ast.Expr(ast.Constant("import " + ", ".join(
            f"{a.name}{' as ' + a.asname if a.asname else ''}" for a in node.names)))


def _source(path: Path, root: Path) -> _Source | None:
    """The normalised digest and package imports of the source file ``path`` (None: not a
    file), read once per process and again whenever the file's stat changes."""
    try:
        info = path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return None
    if not stat.S_ISREG(info.st_mode):
        return None
    stamp = (info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
    known = _SOURCES.get(path)
    if known is not None and known.stamp == stamp:
        return known
    norm = _Normalise(root)
    tree = norm.visit(ast.parse(path.read_bytes()))
    digest = hashlib.sha256(ast.dump(tree).encode()).hexdigest()
    empty = all(isinstance(node, ast.Pass) for node in tree.body)
    source = _Source(stamp, digest, empty, tuple(dict.fromkeys(norm.files)))
    if time.time_ns() - max(info.st_mtime_ns, info.st_ctime_ns) > RACY_SECONDS * 1e9:
        _SOURCES[path] = source
    return source


def package_files(root: Path | None = None) -> tuple[str, ...]:
    """Every ``*.py`` of the package, its subpackages included, relative to its folder."""
    folder = PACKAGE_DIR if root is None else root
    return tuple(sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.py")
                        if "__pycache__" not in p.parts))


def import_closure(entry_points: Iterable[str], root: Path | None = None) -> tuple[str, ...]:
    """The package files (relative paths) that ``entry_points`` (package files) import,
    directly or through each other, themselves included."""
    folder = PACKAGE_DIR if root is None else root
    seen: set[str] = set()
    todo = list(entry_points)
    while todo:
        rel = todo.pop()
        source = None if rel in seen else _source(folder / rel, folder)
        if source is None:
            continue
        seen.add(rel)
        todo += source.imports
    return tuple(sorted(seen))


def source_hash(files: Iterable[str] | None = None, root: Path | None = None) -> str:
    """SHA-256 over the named package files (every one when None), each counted by its
    module's last dotted part and its normalised syntax (see the module docstring); one that
    holds no statement (a wing's ``__init__``) counts for nothing, so a module's folder does
    not reach the key. A missing file is an error; two modules of one name would make a key
    ambiguous, so they are one too."""
    folder = PACKAGE_DIR if root is None else root
    rels = package_files(folder) if files is None else tuple(files)
    named: dict[str, str] = {}
    for rel in rels:
        source = _source(folder / rel, folder)
        if source is None:
            raise FileNotFoundError(f"source file {folder / rel} is missing")
        name = module_name(rel)
        if named.setdefault(name, rel) != rel:
            raise ValueError(f"two package modules are both named {name!r} ({named[name]} and "
                             f"{rel}): a cache key could not tell them apart")
    h = hashlib.sha256()
    for name, rel in sorted(named.items()):
        source = _source(folder / rel, folder)
        if not source.empty:
            h.update(f"{name}\0{source.digest}\0".encode())
    return h.hexdigest()


def key_name(dotted: str) -> str:
    """A dotted name as a key records it: a nopelib module by its last part, so that
    "nopelib.core.model.GPT" and "nopelib.core.model.GPT" are one name; other names unchanged."""
    parts = dotted.split(".")
    if parts[0] == PACKAGE:
        for i in range(len(parts), 1, -1):
            if module_file(".".join(parts[:i])) is not None:
                return ".".join([PACKAGE, parts[i - 1], *parts[i:]])
    return dotted


def module_closure_hash(names: Iterable[str]) -> str:
    """``source_hash`` of the import closure of the nopelib modules that the dotted ``names``
    name (a module, or an object in one, with or without its wing: see ``key_name``); other
    names are skipped: their versions, not their sources, are keyed where they matter."""
    by_name = {module_name(f): f for f in package_files()}
    files = set()
    for name in names:
        parts = key_name(name).split(".")
        if parts[0] == PACKAGE and len(parts) > 1 and parts[1] in by_name:
            files.add(by_name[parts[1]])
    return source_hash(import_closure(sorted(files)))
