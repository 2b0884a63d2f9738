"""The house's rules that the code's own imports can show (docs/DESIGN.md, "Layout"): no import circle among rlvr's
modules (imports inside functions included: a lazy import still makes the two modules one), no library module
importing the command line, rlvr.algo importing only torch and rlvr's leaf modules, the verifiers importing neither
torch nor vLLM, and only rlvr.rollout importing vLLM."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

RLVR = Path(__file__).resolve().parents[1] / "rlvr"


def _module(path: Path) -> str:
    parts = path.relative_to(RLVR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every module `path` imports, at any depth of its code (the top-level package name for outside ones)."""
    found: set[str] = set()
    package = _module(path) if path.name == "__init__.py" else _module(path).rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package
                base = ".".join([*package.split(".")[: len(package.split(".")) - node.level + 1], *([base] if base else [])])
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)  # `from rlvr import x` imports rlvr.x
    return found


MODULES = {_module(p): p for p in sorted(RLVR.rglob("*.py"))}
GRAPH = {name: {m for m in _imports(path) if m in MODULES and m != name and m != "rlvr"} for name, path in MODULES.items()}


def _cycle() -> list[str] | None:
    """One import circle among rlvr's modules, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(GRAPH[m]):
            if state.get(n) == 1:
                return path[path.index(n) :] + [n]
            if n not in state and (found := visit(n)) is not None:
                return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(GRAPH):
        if m not in state and (found := visit(m)) is not None:
            return found
    return None


def test_no_import_circle():
    assert _cycle() is None, " -> ".join(_cycle() or [])


def test_the_cycle_finder_finds_one():
    GRAPH["rlvr.types"].add("rlvr.cli")  # cli imports config ... types: a circle once types imports cli
    try:
        assert _cycle() is not None
    finally:
        GRAPH["rlvr.types"].discard("rlvr.cli")


def test_no_library_module_imports_the_command_line():
    assert [m for m, deps in GRAPH.items() if "rlvr.cli" in deps and m not in ("rlvr.__main__",)] == []


@pytest.mark.parametrize("name", sorted(m for m in MODULES if m.startswith("rlvr.verifiers")))
def test_verifiers_import_neither_torch_nor_vllm(name):
    assert not {m.split(".")[0] for m in _imports(MODULES[name])} & {"torch", "vllm", "transformers"}


def test_algo_imports_only_torch_and_leaf_modules():
    outside = {m.split(".")[0] for m in _imports(MODULES["rlvr.algo"])} - {"rlvr", "__future__"}
    assert outside <= {"torch", "collections", "dataclasses", "math", "typing"}, outside  # (math: GMPO's clip bounds)
    assert GRAPH["rlvr.algo"] <= {"rlvr.types", "rlvr.choices"}, GRAPH["rlvr.algo"]


def test_only_rollout_imports_vllm():
    assert sorted(m for m, p in MODULES.items() if "vllm" in {i.split(".")[0] for i in _imports(p)}) == ["rlvr.rollout"]


def test_the_makefiles_serial_files_are_those_that_hold_serial_tests():
    """make test runs the `serial` tests from the files its SERIAL_FILES names: a file that marks tests serial and is
    not named there would have them run by neither of make test's two sessions."""
    import re

    tests = Path(__file__).resolve().parent
    marked = {p.name for p in tests.glob("test_*.py") if re.search(r"^pytestmark = .*pytest\.mark\.serial", p.read_text(), re.M)}
    makefile = (tests.parent / "Makefile").read_text()
    named = set(re.search(r"^SERIAL_FILES = (.*)$", makefile, re.M).group(1).replace("tests/", "").split())  # type: ignore[union-attr]
    assert named == marked
