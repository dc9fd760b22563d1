"""The house: nopelib's wings, read from the code. A module imports from its own wing and the
ones below it, never from one above; no two modules import each other, directly or around a
circle; every module says its job in its docstring's first line, and README's wing map quotes
each wing's."""

import ast
import importlib
from pathlib import Path

import nopelib
from nopelib.store import sources

PACKAGE = Path(nopelib.__file__).resolve().parent
# lowest first, as the package's docstring lists them
WINGS = ("store", "core", "averaging", "rules", "training", "results", "studies", "book",
         "tools")


def _direct(rel: str) -> set[str]:
    tree = ast.parse((PACKAGE / rel).read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("nopelib"):
            found |= {f for a in node.names
                      if (f := sources.module_file(f"{node.module}.{a.name}")) is not None}
            if (f := sources.module_file(node.module)) is not None:
                found.add(f)
        elif isinstance(node, ast.Import):
            found |= {f for a in node.names if (f := sources.module_file(a.name)) is not None}
    return found


def _modules() -> list[str]:
    return [f for f in sources.package_files() if not f.endswith("__init__.py")]


def test_every_module_lives_in_a_wing_named_in_the_package_docstring():
    wings = {f.split("/")[0] for f in _modules()}
    assert wings == set(WINGS), wings ^ set(WINGS)
    listed = [w for w in WINGS if f"- ``{w}``" in nopelib.__doc__]
    assert listed == list(WINGS)
    assert nopelib.__doc__.index("``store``") < nopelib.__doc__.index("``tools``")


def test_no_module_imports_from_a_higher_wing():
    up = [(f, g) for f in _modules() for g in _direct(f) if not g.endswith("__init__.py")
          and WINGS.index(g.split("/")[0]) > WINGS.index(f.split("/")[0])]
    assert not up, f"imports from a higher wing: {up}"


def test_no_import_circles():
    # a command's module imports itself by name, so that run as __main__ its memoised
    # functions are keyed under their module: not a circle
    graph = {f: {g for g in _direct(f) if not g.endswith("__init__.py") and g != f}
             for f in _modules()}
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(f: str, path: list[str]) -> list[str] | None:
        state[f] = 1
        for g in sorted(graph[f]):
            if state.get(g) == 1:
                return path + [f, g]
            if g not in state and (found := visit(g, path + [f])):
                return found
        state[f] = 2
        return None

    for f in sorted(graph):
        if f not in state:
            assert (circle := visit(f, [])) is None, f"import circle: {' -> '.join(circle)}"


def test_every_module_says_its_job_in_one_line():
    for rel in sources.package_files():
        doc = ast.get_docstring(ast.parse((PACKAGE / rel).read_text()))
        assert doc and doc.splitlines()[0].rstrip().endswith((".", ":", ")", "?")), (
            f"{rel}: its docstring's first line must say its job")


def test_no_module_is_over_400_lines():
    long = {rel: n for rel in sources.package_files()
            if (n := len((PACKAGE / rel).read_text().splitlines())) > 400}
    assert not long, f"modules over 400 lines: {long}"


def test_the_readmes_wing_map_is_the_wings_docstrings():
    # README's map of the package: one line per wing, highest first, each the first line of
    # the wing's own docstring (its __init__), so that the map cannot drift from the code
    readme = (PACKAGE.parent / "README.md").read_text()
    shown = [line for line in readme.splitlines() if line.startswith("- `nopelib/")]
    wanted = [f"- `nopelib/{wing}/` — "
              + importlib.import_module(f"nopelib.{wing}").__doc__.splitlines()[0]
              for wing in reversed(WINGS)]
    assert shown == wanted
