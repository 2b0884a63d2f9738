"""rlvr.imports: the heavy imports run without the cyclic garbage collector, which then skips what they created."""

from __future__ import annotations

import gc
import importlib
import sys

from rlvr.imports import heavy_imports


def test_heavy_imports_run_no_collection_and_freeze_what_they_created(tmp_path, monkeypatch):
    # 50,000 objects in reference cycles: with the collector on, they trigger ~70 generation-0 passes (threshold 700)
    (tmp_path / "cyclic_module_for_test.py").write_text(
        "class Node:\n    pass\n\nnodes = [Node() for _ in range(50_000)]\nfor node in nodes:\n    node.me = node\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    passes: list[int] = []

    def record(phase: str, info: dict) -> None:
        if phase == "start":
            passes.append(info["generation"])

    frozen = gc.get_freeze_count()
    gc.callbacks.append(record)
    try:
        with heavy_imports():
            importlib.import_module("cyclic_module_for_test")
        assert passes == []
        assert gc.isenabled()
        assert gc.get_freeze_count() >= frozen + 50_000
    finally:
        gc.callbacks.remove(record)
        gc.unfreeze()
        sys.modules.pop("cyclic_module_for_test", None)


def test_heavy_imports_leave_a_disabled_collector_disabled():
    gc.disable()
    try:
        with heavy_imports():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
        gc.unfreeze()


def test_a_block_that_imports_nothing_new_freezes_nothing():
    """A sweep's later jobs import nothing new: freezing then would keep the earlier job's garbage for good."""
    class Node:
        pass

    garbage = [Node() for _ in range(1000)]
    for node in garbage:
        node.me = node
    del garbage, node
    frozen = gc.get_freeze_count()
    with heavy_imports():
        importlib.import_module("json")  # imported long ago
    assert gc.get_freeze_count() == frozen
