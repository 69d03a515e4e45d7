"""Module boundaries (shared/style-anchors.md): the runtime never imports the compiler or the registry;
the format and registry packages import nothing else of ours."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"ninfer_format": "formats", "ninfer_registry": "registry", "ninfer_pack": "ninfer_pack", "ninfer_run": "ninfer_run"}
FORBIDDEN = {
    "ninfer_format": {"ninfer_registry", "ninfer_pack", "ninfer_run"},
    "ninfer_registry": {"ninfer_format", "ninfer_pack", "ninfer_run"},
    "ninfer_pack": {"ninfer_run"},
    "ninfer_run": {"ninfer_pack", "ninfer_registry"},
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_forbidden_imports(package):
    offenders = [(str(p.relative_to(ROOT)), sorted(_imports(p) & FORBIDDEN[package]))
                 for p in (ROOT / PACKAGES[package]).rglob("*.py") if _imports(p) & FORBIDDEN[package]]
    assert offenders == []


def test_no_pickle_anywhere():
    for folder in list(PACKAGES.values()) + ["tools"]:
        for p in (ROOT / folder).rglob("*.py"):
            text = p.read_text()
            assert "pickle" not in _imports(p), p
            assert "torch.load(" not in text, p


def test_every_subpackage_ships_in_the_wheel():
    """A package missing from pyproject's list works in an editable install and breaks in a wheel."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = set()
    for name, folder in PACKAGES.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            found.add(".".join([name, *init.parent.relative_to(ROOT / folder).parts]))
    assert found == listed
