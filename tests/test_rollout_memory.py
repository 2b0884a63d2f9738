"""The engine's memory lifecycle around the learner's phases (rlvr.rollout.Memory), with a fake engine: vLLM has no
sleep mode on CPU, so the calls and their order are what can be checked here. FakeLLM records vLLM's calls."""

from __future__ import annotations

from typing import Any

import pytest

from rlvr.rollout import Engine, Memory


class FakeLLM:
    """Stands in for vllm.LLM: records sleep / wake_up / collective_rpc / reset_prefix_cache in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.llm_engine = self  # vLLM's LLM.llm_engine: its LoRA calls
        self.loras: set[int] = set()

    def list_loras(self) -> set[int]:
        return set(self.loras)

    def remove_lora(self, lora_id: int) -> bool:
        self.calls.append(("remove_lora", lora_id))
        self.loras.discard(lora_id)
        return True

    def sleep(self, level: int) -> None:
        self.calls.append(("sleep", level))

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.calls.append(("wake_up", tuple(tags or ())))

    def collective_rpc(self, method: Any, kwargs: dict | None = None) -> None:
        if method == "reload_weights":
            list(kwargs["weights_iterator"])  # the push consumes the learner's gathered weights here
        self.calls.append(("rpc", method if isinstance(method, str) else method.__name__))

    def reset_prefix_cache(self) -> None:
        self.calls.append(("reset_prefix_cache",))

    def generate(self, requests: list, params: list, use_tqdm: bool, lora_request: Any = None) -> list:
        self.calls.append(("generate",) if lora_request is None else ("generate", lora_request.lora_name))
        if lora_request is not None:
            self.loras.add(lora_request.lora_int_id)  # vLLM loads an adapter when a request first needs it
        return []


def fake_engine(enabled: bool, level: int = 1) -> tuple[Engine, FakeLLM]:
    engine = Engine.__new__(Engine)  # no vLLM: only the attributes the lifecycle and the push use
    engine.llm = FakeLLM()  # type: ignore[assignment]
    engine.memory = Memory(engine.llm, enabled=enabled, level=level)
    engine._compiler_stance = "default"
    engine._decodes_texts = True
    engine.adapter = None
    return engine, engine.llm  # type: ignore[return-value]


def test_a_step_sleeps_for_the_learner_then_wakes_weights_pushes_and_wakes_the_kv_cache() -> None:
    engine, llm = fake_engine(enabled=True)
    pushed = []

    def weights():  # the learner's gathered weights: consumed while only the engine's weights are awake
        pushed.append(llm.calls[-1])
        yield "w", None

    engine.generate([(1, 2)], n=2, max_tokens=4, temperature=1.0, top_p=1.0, seeds=[0], stop=[])  # rollout: awake
    engine.sleep()  # the learner's phases
    engine.sleep()  # a second call changes nothing
    engine.load_weights(weights())
    engine.generate([(1, 2)], n=2, max_tokens=4, temperature=1.0, top_p=1.0, seeds=[0], stop=[])
    assert llm.calls[:5] == [("generate",), ("sleep", 1), ("wake_up", ("weights",)), ("rpc", "reload_weights"),
                             ("rpc", "_repack_cpu_embeddings")]  # fmt: skip
    assert llm.calls[5:] == [("wake_up", ("kv_cache",)), ("reset_prefix_cache",), ("generate",)]
    assert pushed == [("wake_up", ("weights",))]  # the weights were awake, the KV cache not yet, during the push


def test_a_sleeping_engine_wakes_whole_before_it_generates() -> None:
    engine, llm = fake_engine(enabled=True)
    engine.sleep()
    engine.generate([(1,)], n=1, max_tokens=2, temperature=0.0, top_p=1.0, seeds=None, stop=[])
    assert llm.calls == [("sleep", 1), ("wake_up", ("weights", "kv_cache")), ("generate",)]


def test_disabled_the_lifecycle_calls_nothing() -> None:
    """rollout.sleep=false, and every CPU run: the step is what it was before the lifecycle existed."""
    engine, llm = fake_engine(enabled=False)
    engine.sleep()
    engine.load_weights(iter([]))
    assert llm.calls == [("rpc", "reload_weights"), ("rpc", "_repack_cpu_embeddings"), ("reset_prefix_cache",)]


def test_an_adapter_push_wakes_the_engine_and_replaces_the_adapter_under_a_new_id_and_name(tmp_path) -> None:
    """model.lora.sync=adapter on a GPU: the push wakes the engine (its base weights come back), drops the previous
    adapter, resets the prefix cache; the next generate carries the new adapter (a new id and a new name: vLLM caches
    adapters by id and keys prefix-cache blocks by name and path)."""
    engine, llm = fake_engine(enabled=True)
    engine.load_adapter(tmp_path)
    engine.generate([(1, 2)], n=1, max_tokens=1, temperature=1.0, top_p=1.0, seeds=None, stop=[])
    engine.sleep()
    engine.load_adapter(tmp_path)
    engine.generate([(1, 2)], n=1, max_tokens=1, temperature=1.0, top_p=1.0, seeds=None, stop=[])
    assert llm.calls == [("reset_prefix_cache",), ("generate", "policy-1"), ("sleep", 1), ("wake_up", ("weights", "kv_cache")),
                         ("remove_lora", 1), ("reset_prefix_cache",), ("generate", "policy-2")]  # fmt: skip
    assert engine.adapter is not None and (engine.adapter.lora_int_id, engine.adapter.lora_path) == (2, str(tmp_path))


def test_full_weight_pushes_sleep_at_level_2_and_adapters_at_level_1() -> None:
    """Level 2 drops the weights (every full push replaces them all: no host copy out and back); an adapter push
    leaves the base in place, so its engine keeps the weights through the sleep (level 1: rlvr.memory.sleep_level, which
    the engine and the plan share, tests/test_memory.py)."""
    engine, llm = fake_engine(enabled=True, level=2)
    engine.sleep()
    engine.load_weights(iter([]))
    assert llm.calls[:2] == [("sleep", 2), ("wake_up", ("weights",))] and llm.calls[4] == ("wake_up", ("kv_cache",))
    assert (engine.memory.level, Memory(llm, enabled=False, level=2).level) == (2, 0)  # settings.json's sleep_level


def test_weights_dropped_by_level_2_are_never_woken_without_a_push() -> None:
    """After a level-2 sleep the weights' memory holds whatever it was freed with: generating before a push refilled
    them is refused, not sampled from."""
    engine, llm = fake_engine(enabled=True, level=2)
    engine.sleep()
    with pytest.raises(RuntimeError, match="dropped by its level-2 sleep and no push has refilled them"):
        engine.generate([(1,)], n=1, max_tokens=2, temperature=0.0, top_p=1.0, seeds=None, stop=[])
    assert llm.calls == [("sleep", 2)]
    llm.collective_rpc = lambda *args, **kwargs: (_ for _ in ()).throw(RuntimeError("reload failed"))  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="reload failed"):
        engine.load_weights(iter([]))  # woke the weights, then the reload raised: they hold nothing yet
    with pytest.raises(RuntimeError, match="no push has refilled them"):
        engine.generate([(1,)], n=1, max_tokens=2, temperature=0.0, top_p=1.0, seeds=None, stop=[])
