"""The package declares what it imports: every module imports with ``pip install .`` alone
(pyproject's dependencies), and what one job needs beyond them is an extra."""

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "nopelib"
# import name -> distribution name, where they differ
DISTRIBUTION = {"yaml": "pyyaml", "myst_nb": "myst-nb"}


def _declared() -> tuple[set[str], set[str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def names(reqs: list[str]) -> set[str]:
        return {re.split(r"[<>=!\[; ]", r, maxsplit=1)[0].lower() for r in reqs}

    extras = set().union(*map(names, project["optional-dependencies"].values()))
    return names(project["dependencies"]), extras


def _third_party(node: ast.AST) -> str | None:
    if isinstance(node, ast.Import):
        name = node.names[0].name
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        name = node.module
    else:
        return None
    top = name.split(".")[0]
    if top in sys.stdlib_module_names or top in ("nopelib", "__future__"):
        return None
    return DISTRIBUTION.get(top, top).lower()


def _dotted(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_every_import_is_declared():
    core, extras = _declared()
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_bytes())
        top_level = {_third_party(n) for n in tree.body} - {None}
        anywhere = {_third_party(n) for n in ast.walk(tree)} - {None}
        assert top_level <= core, f"{path.name} imports {top_level - core} at module level"
        assert anywhere <= core | extras, f"{path.name} imports undeclared {anywhere - core - extras}"


def test_every_module_imports_without_the_extras():
    _, extras = _declared()
    blocked = sorted({"ray", "myst_nb", "nbclient", "nbformat", "yaml", "jupyter_book",
                      "papermill", "pytest", "hypothesis", "nbval", "playwright"})
    modules = sorted(_dotted(p) for p in PACKAGE.rglob("*.py"))
    script = f"""
import importlib, sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ImportError("not installed: " + name)
sys.meta_path.insert(0, Block())
for m in {modules!r}:
    importlib.import_module(m)
print("imported", len({modules!r}))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"imported {len(modules)}" in proc.stdout
