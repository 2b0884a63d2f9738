"""The user's own functions as tools (rollout.tools=[mypkg.tools:lookup]), offered through the model's chat template.

A function is named by import path, as reward.fn is, and described to the model by its signature and Google-style
docstring (transformers' `get_json_schema`, the schema `apply_chat_template(tools=...)` takes). The prompt is the chat
template rendered with `tools=` those schemas; a template that ignores them (SmolLM2's does) gets rlvr's own
description instead, FUNCTIONS_PROMPT, at the end of the system message. The model calls in the JSON format of the
Qwen2.5/Qwen3, Hermes and SmolLM3 templates, one object per call, and ends its turn:

    <tool_call>
    {"name": "lookup", "arguments": {"word": "cat"}}
    </tool_call><|im_end|>

Every call of that turn runs (in parallel, rollout.tool.workers at a time) in a worker process (rlvr.function_workers),
WITH THE USER'S RIGHTS, as a user reward.fn does: no sandbox, so a function is trusted code; one that runs past
rollout.tool.timeout_s is killed with its worker, whatever it was doing. Each result (a str as it is, anything else
as JSON, cut at 64 KiB) comes back as a `tool` message the template renders, followed by the next assistant header,
and the model goes on. The template's own text around the results is markup (its special tokens are tokens); the
results are plain text (rlvr.multiturn encodes them so that no special or added token forms from them). A malformed
call (not JSON, no such function, arguments that do not fit), a function that raises, or one that times out is an
error output for that answer, never a crash.

This module imports neither torch nor vllm (transformers only when it builds schemas).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rlvr.config import ConfigError
from rlvr.function_workers import FunctionWorkers
from rlvr.tools import Piece, ToolResult

if TYPE_CHECKING:
    from rlvr.types import ToolCall

FUNCTIONS_PROMPT = """You can call these functions, each described in JSON:
<tools>
{tools}
</tools>
To call one, write its name and arguments as one JSON object between <tool_call> and </tool_call>, then end your turn.
Its result comes back in the next message, and you go on from there:
<tool_call>
{{"name": "<function name>", "arguments": {{"<argument>": <value>}}}}
</tool_call>"""

_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)  # an unclosed last call is read to the turn's end
_ANSWER_MARK = "RLVR_ANSWER_MARK"
_RESULT_MARK = 'RLVR"RESULT\n{}MARK'  # a quote and a newline inside: a template that escapes results (tojson) shows


def is_function(name: str) -> bool:
    """Whether a rollout.tools entry names a function by import path ("package.module:function")."""
    return ":" in name


def load(names: list[str]) -> tuple[dict[str, Callable[..., Any]], list[dict]]:
    """The functions rollout.tools names by import path, by the name the model calls them by, and their JSON schemas;
    ConfigError naming the entry when one cannot be imported or described."""
    from transformers.utils import get_json_schema

    from rlvr.verifiers.pool import load_function

    functions: dict[str, Callable[..., Any]] = {}
    schemas = []
    for path in (n for n in names if is_function(n)):
        try:
            fn = load_function(path)
        except ValueError as e:
            raise ConfigError(f"rollout.tools: {e}") from None
        try:
            schema = get_json_schema(fn)
        except Exception as e:  # transformers' DocstringParsingException, TypeHintParsingException
            raise ConfigError(
                f"rollout.tools: {path!r} cannot be described to the model: {e} (a tool function needs type hints and a "
                f"Google-style docstring with an 'Args:' line for each argument, as apply_chat_template(tools=...) takes)"
            ) from None
        if _reachable(fn) is not fn:
            raise ConfigError(f"rollout.tools: {path!r} cannot be imported again as {_path(fn)!r} (its module and "
                              f"qualified name), which is how a worker process loads it; name a module-level function")  # fmt: skip
        name = schema["function"]["name"]
        if name in functions:
            raise ConfigError(f"rollout.tools: two functions are named {name!r} ({path!r} and an earlier entry): the "
                              f"model calls functions by name")  # fmt: skip
        functions[name] = fn
        schemas.append(schema)
    return functions, schemas


def describe(schemas: list[dict]) -> str:
    """rlvr's description of the functions, for a chat template that does not render `tools` itself."""
    return FUNCTIONS_PROMPT.format(tools="\n".join(json.dumps(s, ensure_ascii=False) for s in schemas))


def renders_tools(tokenizer: Any, messages: list[dict], schemas: list[dict], template_kwargs: dict | None = None) -> bool:
    """Whether the tokenizer's chat template describes the tools itself, in the <tool_call> format rlvr reads: it
    renders otherwise with them than without, and its text names <tool_call>. A template that teaches another format
    (Llama 3.1's bare JSON, Qwen3-Coder's XML) is not used for them: rlvr's description is, so that the model is told
    the format its calls are read in."""
    kwargs: dict[str, Any] = {"add_generation_prompt": True, "tokenize": False, **(template_kwargs or {})}
    with_tools = tokenizer.apply_chat_template(messages, tools=schemas, **kwargs)
    return with_tools != tokenizer.apply_chat_template(messages, **kwargs) and "<tool_call>" in with_tools


class ChatFrame:
    """The chat template's text around tool results: what follows the model's end-of-turn token after a turn of calls,
    up to the next assistant header, with the results left out. Rendered from the template itself (a conversation
    with marks in place of the contents), so every template's own layout holds: Qwen's <tool_response> blocks inside
    one user turn, a `tool` role of its own in ChatML."""

    def __init__(self, tokenizer: Any, schemas: list[dict], max_results: int = 1, template_kwargs: dict | None = None,
                 *, role: str = "tool", key: str = "rollout.tools") -> None:  # fmt: skip
        self.tokenizer = tokenizer
        self.schemas = schemas
        self.template_kwargs = dict(template_kwargs or {})  # data.chat_template_kwargs: as the prompts were rendered
        self.role = role  # "tool": a function's results; "user": an environment's observation (rlvr.envs)
        self.key = key  # the config key an error names
        self._around: dict[int, list[str]] = {}
        # every number of results one turn may show (rollout.max_turns calls at most): a template that renders one
        # tool message but refuses two in a row (roles that must alternate) fails here, before any model loads
        for n in range(1, max_results + 1):
            self.around(n, max_results)
        if role == "tool" and "<tool_call>" in getattr(tokenizer, "all_special_tokens", []):
            raise ConfigError("rollout.tools: the tokenizer has <tool_call> as a special token, which the engine leaves "
                              "out of the text calls are read from")  # fmt: skip

    def around(self, n: int, max_results: int | None = None) -> list[str]:
        """The n + 1 markup texts around n results, in order."""
        if n not in self._around:
            marks = [_RESULT_MARK.format(i) for i in range(n)]
            conversation = [{"role": "user", "content": "RLVR_QUESTION_MARK"}, {"role": "assistant", "content": _ANSWER_MARK},
                            *({"role": self.role, "content": m} for m in marks)]  # fmt: skip
            key, result = self.key, "a function's result" if self.role == "tool" else "an environment's observation"
            what = result + ("" if n == 1 else f" when one turn makes {n} calls ({n} results, 'tool' messages in a row")
            allows = "" if n == 1 else f"; rollout.max_turns={max_results} allows {max_results} calls in one turn)"
            try:
                text = self.tokenizer.apply_chat_template(conversation, tools=self.schemas or None, add_generation_prompt=True,
                                                          tokenize=False, **self.template_kwargs)  # fmt: skip
            except Exception as e:  # jinja's errors, a template's raise_exception
                raise ConfigError(f"{key}: the model's chat template cannot render {what}{allows} (a {self.role!r} "
                                  f"message after the assistant's): {type(e).__name__}: {e}") from None  # fmt: skip
            positions = [text.find(m) for m in (_ANSWER_MARK, *marks)]
            if min(positions) < 0 or positions != sorted(positions):
                raise ConfigError(f"{key}: the model's chat template leaves out, rewrites (e.g. quotes them as "
                                  f"JSON) or reorders {self.role} messages, so rlvr cannot show {result} as the "
                                  f"template would")  # fmt: skip
            after = text[positions[0] + len(_ANSWER_MARK) :]
            eos = self.tokenizer.eos_token or ""
            if not eos or not after.startswith(eos):
                raise ConfigError(f"{key}: the model's chat template ends an assistant message with "
                                  f"{after[:20]!r}, not with the token the model ends its turns with ({eos!r}); "
                                  f"{'function tools' if self.role == 'tool' else 'environments'} need the two to be the same")  # fmt: skip
            pieces = re.split("|".join(map(re.escape, marks)), after[len(eos) :])
            if len(pieces) != n + 1:
                raise ConfigError(f"{key}: the model's chat template shows a {self.role} message more than once "
                                  f"({len(pieces) - 1} places for {n}), so rlvr cannot show it as the template would")  # fmt: skip
            self._around[n] = pieces
        return self._around[n]


class FunctionTools:
    """The user's functions as one tool: calls in the JSON format above, results as the template's tool messages."""

    name = "functions"
    stop: tuple[str, ...] = ()
    turn_end = True

    def __init__(self, functions: dict[str, Callable[..., Any]], frame: ChatFrame, timeout_s: float, workers: int = 4) -> None:
        self.functions = functions
        self.frame = frame
        self.timeout_s = timeout_s
        self.workers = FunctionWorkers({name: _path(fn) for name, fn in functions.items()}, workers=workers, timeout_s=timeout_s)

    def parse(self, turn: str) -> list[str]:
        """The text of each <tool_call> block of the turn, in order (an unclosed last one to the turn's end)."""
        return [m.group(1).strip() for m in _CALL.finditer(turn)]

    def run(self, request: str, earlier: list[ToolCall]) -> ToolResult:
        start = time.monotonic()

        def error(message: str, status: str = "error") -> ToolResult:
            return ToolResult(f"[{message}]", status, time.monotonic() - start)

        try:
            call = json.loads(request)
        except ValueError as e:
            return error(f"the tool call is not JSON: {e}")
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return error('a tool call is one JSON object: {"name": <function name>, "arguments": {...}}')
        name, args = call["name"], call.get("arguments", call.get("parameters"))  # "parameters": Llama's spelling
        args = {} if args is None else args
        if name not in self.functions:
            return error(f"there is no function {name[:100]!r}; the functions are {sorted(self.functions)}")
        if isinstance(args, str):  # some models write the arguments as a JSON string
            try:
                args = json.loads(args)
            except ValueError:
                pass
        if not isinstance(args, dict):
            return error(f"the arguments of {name} must be a JSON object, not {type(args).__name__}")
        status, text = self.workers.call(name, args)
        return ToolResult(text, status, time.monotonic() - start)

    def close(self) -> None:
        """Stop the worker processes."""
        self.workers.close()

    def format(self, outputs: list[str]) -> list[Piece]:
        around = self.frame.around(len(outputs))
        pieces: list[Piece] = [(around[0], True)]
        for output, markup in zip(outputs, around[1:], strict=True):
            pieces += [(output, False), (markup, True)]
        return [p for p in pieces if p[0]]


def _path(function: Callable[..., Any]) -> str:
    """The import path a worker process loads `function` by: its module and qualified name (load() checks it)."""
    return f"{getattr(function, '__module__', '')}:{getattr(function, '__qualname__', '')}"


def _reachable(function: Callable[..., Any]) -> object:
    from rlvr.verifiers.pool import load_function

    try:
        return load_function(_path(function))
    except ValueError:
        return None
