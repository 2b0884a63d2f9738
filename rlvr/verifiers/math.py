"""Verifier for free-form math answers (MATH, GSM8K, DAPO-Math style).

`verify(completion, answer)` extracts the final answer of a completion (the last `\\boxed{...}`,
else the last "Answer: ..." line, else the last "#### ..." line) and compares it with the ground
truth using `math_verify` (fractions, decimals, LaTeX, expressions, sets, intervals, units), with a
strict normalized-string fallback when `math_verify` cannot parse either side.

Conventions where answers are ambiguous (documented so the reward is predictable):
- Percent signs are dropped before comparing: `50\\%` equals `50`, not `0.5` (the MATH convention).
- Trailing units are dropped: `5 cm`, `5\\text{ cm}` and `5` are equal.
- Thousands separators (`1,000`, `1{,}000`, `1\\,000`, `1 000`) are dropped when the whole answer
  is one number; `1,2` elsewhere stays a list.
- Scientific notation `1.2e3` is read as the number 1200.

Bounds on untrusted text: only the last `SCAN_CHARS` characters of a completion are scanned (a
`\\boxed{` that opens before them is not seen); extracted answers longer than `MAX_ANSWER_CHARS`
are compared as strings only. `math_verify` is called with its SIGALRM timeouts disabled (they
raise off the main thread), so a pathological answer (`9^{9^{9^{9}}}`) can run for a long time:
bound the wall-clock time by calling through `rlvr.verifiers.pool.VerifierPool`.
"""

from __future__ import annotations

import functools
import logging
import re
from decimal import Decimal, InvalidOperation
from fractions import Fraction

from math_verify import parse as _mv_parse
from math_verify import verify as _mv_verify

from rlvr.verifiers import Outcome

SCAN_CHARS = 20_000  # only the tail of a completion is searched for its answer
MAX_ANSWER_CHARS = 500  # longer extracted answers skip math_verify (string comparison only)
EXTRACTORS = ("boxed", "answer_line", "hashes")

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_BRACE_TOKENS = re.compile(r"\\boxed|\\fbox|\\[{}]|[{}]")  # one token per match: no backtracking
_ANSWER_LINE = re.compile(r"answer[ \t*]*[:\uff1a][ \t]*([^\n]*)", re.IGNORECASE)
_HASHES_LINE = re.compile(r"####[ \t]*([^\n]*)")
_NUM = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)"  # unambiguous: no backtracking over a digit run
_NUMBER = re.compile(_NUM)
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(?:(?:,|\{,\}|\\,|\\ |~| )\d{3})+(?:\.\d+)?")
_SEPARATOR = re.compile(r",|\{,\}|\\,|\\ |~| ")
_SCIENTIFIC = re.compile(_NUM + r"[eE][+-]?\d{1,2}")
_TEXT_WRAP = re.compile(r"\\(?:text|textbf|mbox|mathrm)\{([^{}]{0,100})\}")
_TRAILING_TEXT = re.compile(r"(?<=\S)\s*\\(?:text|mbox|mathrm)\{[^{}]{0,100}\}$")
_TRAILING_WORDS = re.compile(rf"({_NUM}) [A-Za-z]{{2,20}}(?: [A-Za-z]{{1,20}}){{0,3}}")  # "42 apples"
_SPACES = re.compile(r"\s+")


def _boxed(text: str) -> str | None:
    """Content of the last complete `\\boxed{...}` / `\\fbox{...}`: one linear scan with a brace stack."""
    stack: list[int | None] = []  # per open brace: content start if it opens a box, else None
    pending_box = -1  # end of the last box command; its next `{` opens a box
    best: tuple[int, int] | None = None  # (start, end) of the box that closed last
    for m in _BRACE_TOKENS.finditer(text):
        tok = m.group()
        if tok in _BOX_COMMANDS:
            pending_box = m.end()
        elif tok == "{":
            opens_box = pending_box >= 0 and not text[pending_box : m.start()].strip()
            stack.append(m.end() if opens_box else None)
            pending_box = -1
        elif tok == "}":
            start = stack.pop() if stack else None
            if start is not None:
                best = (start, m.start())
        # escaped braces `\{` `\}` are literal characters and match nothing
    return text[best[0] : best[1]].strip() if best else None


def _last_line(pattern: re.Pattern[str], text: str) -> str | None:
    found = None
    for m in pattern.finditer(text):
        found = m.group(1)
    found = found.strip().strip("*").strip() if found is not None else None
    return found or None


def extract_answer(text: str, *, extractors: tuple[str, ...] = EXTRACTORS) -> str | None:
    """The final answer of a completion, trying `extractors` in order; None if none finds one.

    "boxed": the last complete `\\boxed{...}` or `\\fbox{...}` (an unclosed one is skipped);
    "answer_line": the rest of the last line containing "Answer:" (any case);
    "hashes": the rest of the last "####" line (GSM8K).
    Only the last `SCAN_CHARS` characters of `text` are searched.
    """
    unknown = [name for name in extractors if name not in EXTRACTORS]
    if unknown:
        raise ValueError(f"unknown extractor(s) {unknown}; valid: {', '.join(EXTRACTORS)}")
    window = text[-SCAN_CHARS:]
    for name in extractors:  # the one dispatch on extractor names
        if name == "boxed":
            found = _boxed(window)
            for _ in range(3):  # `\boxed{\boxed{9}}` -> 9; a few levels, not an unbounded loop
                if found and found.startswith(_BOX_COMMANDS) and found.endswith("}"):
                    found = _boxed(found) or found
        elif name == "answer_line":
            found = _last_line(_ANSWER_LINE, window)
        else:
            found = _last_line(_HASHES_LINE, window)
        if found:
            return found
    return None


def normalize(answer: str) -> str:
    """Canonical spelling of an answer: the conventions in the module docstring, spaces collapsed."""
    s = answer.strip()
    if len(s) > MAX_ANSWER_CHARS:
        return s  # too long to be a real answer: compared verbatim, no regex work on it
    s = s.replace("\\$", "").replace("$", "").replace("\\left", "").replace("\\right", "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("\\displaystyle", "")
    s = s.replace("\\%", "").replace("%", "").replace("\\!", "")
    s = _TRAILING_TEXT.sub("", s)  # "5\text{ cm}" -> "5"
    s = _TEXT_WRAP.sub(r"\1", s).strip()  # "\text{Monday}" -> "Monday"
    s = _SPACES.sub(" ", s).strip().rstrip(".").strip()
    if m := _TRAILING_WORDS.fullmatch(s):  # "42 apples" -> "42"
        s = m.group(1)
    if _THOUSANDS.fullmatch(s):
        s = _SEPARATOR.sub("", s)
    if _SCIENTIFIC.fullmatch(s):
        try:
            s = format(Decimal(s).normalize(), "f")
        except InvalidOperation:
            pass
    return s


def _as_fraction(s: str) -> Fraction | None:
    return Fraction(s) if _NUMBER.fullmatch(s) else None


@functools.lru_cache(maxsize=8192)
def _parse(answer: str) -> list:
    """math_verify's parse of one answer (normalized), SIGALRM timeout disabled; cached."""
    return _mv_parse(f"${answer}$", parsing_timeout=None)  # type: ignore[arg-type]


@functools.lru_cache(maxsize=8192)
def _equivalent_normalized(pred: str, gold: str) -> bool:
    if not pred or not gold:
        return False
    if pred.replace(" ", "") == gold.replace(" ", ""):
        return True  # strict: normalized string equality
    if len(pred) > MAX_ANSWER_CHARS or len(gold) > MAX_ANSWER_CHARS:
        return False
    pf, gf = _as_fraction(pred), _as_fraction(gold)
    if pf is not None and gf is not None:  # both plain numbers: exact, no sympy
        if pf == gf or "." not in pred + gold:
            return pf == gf  # (decimals that differ still go to math_verify, which rounds)
    gold_parsed, pred_parsed = _parse(gold), _parse(pred)
    if all(isinstance(x, str) for x in gold_parsed) or all(isinstance(x, str) for x in pred_parsed):
        return False  # math_verify could not parse a side: the strict comparison above was the answer
    return bool(_mv_verify(gold_parsed, pred_parsed, timeout_seconds=None))


def _judge(completion: str, answer: str) -> bool | None:
    """None if no answer can be extracted, else whether it equals `answer`."""
    extracted = extract_answer(completion)
    if extracted is None:
        return None
    return _equivalent_normalized(normalize(extracted), normalize(answer))


def is_equivalent(completion: str, answer: str) -> bool:
    """True if the final answer extracted from `completion` equals the ground truth `answer`."""
    return _judge(completion, answer) is True


def verify(completion: str, answer: str) -> Outcome:
    """NO_ANSWER if no final answer can be extracted, else CORRECT / INCORRECT."""
    same = _judge(completion, answer)
    if same is None:
        return Outcome.NO_ANSWER
    return Outcome.CORRECT if same else Outcome.INCORRECT


class _DropTimeoutDisabledWarning(logging.Filter):
    """math_verify warns once per process that its timeouts are off; here that is by design."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropTimeoutDisabledWarning())


def format_score(completion: str, answer: str) -> float:
    """An optional format term: 1.0 when the completion states a final answer we can extract, else 0.0.

    Use it as a weighted reward term: `'+reward.terms=[{fn: "rlvr.verifiers.math:format_score", weight: 0.1}]'`.
    """
    return 1.0 if extract_answer(completion) is not None else 0.0
