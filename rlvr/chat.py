"""The chat template as a run renders it: the model folder's, or model.chat_template's text in its place, and always with
data.chat_template_kwargs (`{enable_thinking: false}` for Qwen3 or SmolLM3).

One template and one set of arguments at every render: training and held-out prompts (rlvr.prompts, so `rlvr eval`
too, and the prompt budget), the function tools' description check and their result frames (rlvr.function_tools). A
render that forgot them would train tokens of another mode than the prompts'. Both keys are in the run's config.yaml,
so a resume and `rlvr eval run=` render as the run did; the final model's folder is saved with the run's template.

An argument the template does not read is no error (templates ignore what they do not use, as transformers passes them
on); a template that fails to render with the arguments is a ConfigError naming data.chat_template_kwargs, and a
model.chat_template file that is missing or does not parse is one naming model.chat_template, before any model loads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlvr.config import ConfigError

# apply_chat_template's own arguments: rlvr sets them per render, so they cannot be template arguments
RESERVED = frozenset({"conversation", "tools", "documents", "chat_template", "add_generation_prompt", "continue_final_message",
                      "tokenize", "padding", "truncation", "max_length", "return_tensors", "return_dict",
                      "return_assistant_tokens_mask", "tokenizer_kwargs", "messages"})  # fmt: skip
_PROBE = [{"role": "user", "content": "?"}]


def read_template(path: str | None) -> str | None:
    """model.chat_template's text (None: the model folder's own); ConfigError naming the key when the file is missing,
    unreadable or not a Jinja template transformers can compile."""
    if path is None:
        return None
    file = Path(path).expanduser()
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"model.chat_template: cannot read {str(file)!r}: {type(e).__name__}: {e}") from None
    from jinja2 import TemplateError
    from transformers.utils.chat_template_utils import _compile_jinja_template

    try:
        _compile_jinja_template(text)
    except TemplateError as e:
        lineno = getattr(e, "lineno", None)  # a syntax error's
        line = f" (line {lineno})" if lineno else ""
        raise ConfigError(f"model.chat_template: {str(file)!r} is not a chat template transformers can compile{line}: "
                          f"{type(e).__name__}: {e}") from None  # fmt: skip
    return text


def template_kwargs(kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """data.chat_template_kwargs as render arguments ({} for null); ConfigError for one that rlvr sets itself."""
    taken = sorted(RESERVED & set(kwargs or {}))
    if taken:
        raise ConfigError(f"data.chat_template_kwargs: {', '.join(taken)} {'is' if len(taken) == 1 else 'are'} set by rlvr "
                          f"at each render (apply_chat_template's own arguments), not a template argument")  # fmt: skip
    return dict(kwargs or {})


def use_template(tokenizer: Any, template: str | None) -> Any:
    """`tokenizer`, rendering with `template` from now on when one is given (model.chat_template)."""
    if template is not None:
        tokenizer.chat_template = template
    return tokenizer


def check(tokenizer: Any, kwargs: dict[str, Any]) -> None:
    """The template renders a one-message conversation with the arguments: ConfigError naming data.chat_template_kwargs
    when only the arguments make it fail (a template that fails without them fails where it is first rendered)."""
    if not kwargs:
        return
    try:
        tokenizer.apply_chat_template(_PROBE, add_generation_prompt=True, tokenize=False, **kwargs)
    except Exception as e:  # jinja's errors, a template's raise_exception
        try:
            tokenizer.apply_chat_template(_PROBE, add_generation_prompt=True, tokenize=False)
        except Exception:  # noqa: BLE001  (the template's own fault: reported where it is rendered)
            return
        raise ConfigError(f"data.chat_template_kwargs={kwargs}: the chat template fails to render with them: "
                          f"{type(e).__name__}: {e}") from None  # fmt: skip
