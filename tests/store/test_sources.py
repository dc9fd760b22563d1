"""How cache keys see the code (nopelib.store.sources): syntax, not bytes; modules by name, not
folder; import closures through every subpackage."""

import pytest

from nopelib.store import sources
from nopelib.training import runs

ENTRY = '''"""An entry point."""
from nopelib.core import model
from nopelib.wing.deep import helper as h


def run():
    """Trains."""
    return model.X + h.Y  # the sum
'''


def _package(root, files):
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.fixture
def pkg(tmp_path):
    return _package(tmp_path / "nopelib", {
        "__init__.py": '"""The package."""\n',
        "core/__init__.py": '"""Core."""\n',
        "core/model.py": "X = 1\n",
        "wing/__init__.py": "",
        "wing/deep/__init__.py": "",
        "wing/deep/helper.py": "Y = 2\n",
        "entry.py": ENTRY,
        "viz.py": "Z = 3\n",
    })


def test_the_closure_recurses_into_subpackages_and_counts_their_inits(pkg):
    assert sources.import_closure(["entry.py"], pkg) == (
        "__init__.py", "core/__init__.py", "core/model.py", "entry.py", "wing/__init__.py",
        "wing/deep/__init__.py", "wing/deep/helper.py")


def test_an_edit_inside_a_wing_changes_exactly_the_keys_that_import_it(pkg):
    keys = {m: sources.source_hash(sources.import_closure([m], pkg), pkg)
            for m in ("entry.py", "viz.py", "core/model.py")}
    (pkg / "wing/deep/helper.py").write_text("Y = 3\n")
    after = {m: sources.source_hash(sources.import_closure([m], pkg), pkg) for m in keys}
    assert [m for m in keys if after[m] != keys[m]] == ["entry.py"]


def test_comments_docstrings_and_layout_compute_nothing(pkg):
    before = sources.source_hash(sources.import_closure(["entry.py"], pkg), pkg)
    edited = ENTRY.replace('"""Trains."""', '"""Trains, as the docs say."""')
    edited = edited.replace("# the sum", "# another comment").replace("+ h.Y", "+  h.Y")
    (pkg / "entry.py").write_text(edited + "\n\n# the end\n")
    assert sources.source_hash(sources.import_closure(["entry.py"], pkg), pkg) == before
    (pkg / "entry.py").write_text(ENTRY.replace("+ h.Y", "- h.Y"))
    assert sources.source_hash(sources.import_closure(["entry.py"], pkg), pkg) != before


def test_moving_a_module_to_another_wing_keeps_the_key(pkg, tmp_path):
    before = sources.source_hash(sources.import_closure(["entry.py"], pkg), pkg)
    moved = _package(tmp_path / "moved" / "nopelib", {
        "__init__.py": '"""The package."""\n',
        "core/__init__.py": '"""Core."""\n',
        "core/model.py": "X = 1\n",
        "core/helper.py": "Y = 2\n",
        "wing/__init__.py": "",
        "wing/deep/__init__.py": "",
        "entry.py": ENTRY.replace("nopelib.wing.deep import helper",
                                  "nopelib.core import helper"),
    })
    closure = sources.import_closure(["entry.py"], moved)
    assert "core/helper.py" in closure and "wing/deep/__init__.py" not in closure
    assert sources.source_hash(closure, moved) == before
    # importing another name of the same module is another program
    (moved / "core/helper.py").write_text("Y = 2\nW = 2\n")
    (moved / "entry.py").write_text(ENTRY.replace("nopelib.wing.deep import helper as h",
                                                  "nopelib.core.helper import W as h"))
    assert sources.source_hash(sources.import_closure(["entry.py"], moved), moved) != before


def test_two_modules_of_one_name_are_refused(pkg):
    (pkg / "wing/model.py").write_text("X = 1\n")
    with pytest.raises(ValueError, match="both named 'model'"):
        sources.source_hash(None, pkg)


def test_the_package_names_each_module_once_and_training_sees_its_code():
    names = [sources.module_name(f) for f in sources.package_files()]
    assert len(names) == len(set(names))
    assert {"model.py", "train.py", "runs.py", "batched.py"} <= {
        f.rsplit("/", 1)[-1] for f in runs.training_sources()}


def test_a_key_names_a_module_without_its_wing(pkg, monkeypatch):
    monkeypatch.setattr(sources, "PACKAGE_DIR", pkg)
    assert sources.key_name("nopelib.wing.deep.helper.f") == "nopelib.helper.f"
    assert sources.key_name("nopelib.core") == "nopelib.core"
    assert sources.key_name("numpy.linalg.norm") == "numpy.linalg.norm"
