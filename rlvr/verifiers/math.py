"""Verifier for free-form math answers (MATH, GSM8K, DAPO-Math style).

`verify(completion, answer, extract=...)` extracts the final answer of a completion with the named
extractors, tried in order (the first that finds something wins; `DEFAULT_EXTRACT` reads a
`\\boxed{...}`, then an "Answer: ..." line, then "The final answer is ..." phrasings, then "#### ..."),
and compares it with the ground truth using `math_verify` (fractions, decimals, LaTeX, expressions,
sets, intervals, units), with a strict normalized-string fallback when `math_verify` cannot parse
either side or the answer is refused (below).

Conventions where answers are ambiguous (documented so the reward is predictable):
- Percent signs are dropped before comparing: `50\\%` equals `50`, not `0.5` (the MATH convention).
- Trailing units are dropped: `5 cm`, `5\\text{ cm}` and `5` are equal.
- Thousands separators (`1,000`, `1{,}000`, `1\\,000`, `1 000`) are dropped when the whole answer
  is one number; `1,2` elsewhere stays a list.
- Scientific notation `1.2e3` is read as the number 1200.

Bounds on untrusted text: every call returns within about `DEADLINE_S` plus milliseconds, on any
input, in the calling process and from any thread (math_verify's SIGALRM timeouts are off: they fail
off the main thread). Only the last `SCAN_CHARS` characters of a completion are scanned, with
linear-time patterns. Plain numbers compare exactly without sympy. Before sympy sees an answer
(either side), it is refused -- compared as a normalized string only -- when:
- it is longer than `MAX_ANSWER_CHARS`, or nests brackets/arguments deeper than `MAX_NESTING`;
- an upper estimate of the numbers it could evaluate to exceeds `MAX_DIGITS` digits (what sympy
  would compute in one uninterruptible big-integer operation). The estimate reads the LaTeX: a number
  counts its digits, a letter or constant counts as 10, items side by side or combined multiply
  (their digits add); `a^b` (also `**`, `e^`, `\\exp b`, `\\sinh`, `\\cosh`) has digits(a) * b;
  `a^b^c` is read as the larger a^(b^c); `n!` and `\\Gamma(n)` have n * digits(n);
  `\\binom{n}{k}` and `{n \\choose k}` 2^n; `\\prod_{i=a}^{b} f` has (b-a) * digits(f), `\\sum`
  and `\\int` add the digits of their limits, and inside them a letter counts as the upper limit.
  So `9^{9^{9}}`, `10^{10^{10}}`, `99999999!`, `\\prod_{i=1}^{10^9} i` and `2^{2^{2^{2^{2}}}}` are
  refused while `2^{10}`, `2^{2023}`, `100!`, `\\binom{30}{15}` and `e^{-x^2}` are not; a symbolic
  tower such as `x^{y^{z}}` is (letters count as 10);
- it uses what the parser evaluates eagerly, out of reach of the estimate: `\\operatorname{...}`
  (matrix constructors such as `zeros(n, n)`) and substitution bars `f|_{x=a}`.
What sympy still does slowly (simplifying, solving, parsing a long answer with its Python ANTLR
parser) is Python code: a wall-clock deadline stops it. `sys.settrace` in the calling thread raises
once `DEADLINE_S` has passed (at the next Python call that is not in an import, a context manager's
exit, a finalizer or a generator), and the pair counts as not equivalent (and is not cached). The
tracer slows the sympy path about 2.5x; plain-number and string comparisons do not use it. A raise
swallowed by a bare `except:` (a few in mpmath's conversions) would let that call run on: the
worker pool's timeout (`rlvr.verifiers.pool`) stays the outer bound.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import re
import sys
import time
from collections.abc import Iterable
from decimal import Decimal, InvalidOperation
from fractions import Fraction

from math_verify import parse as _mv_parse
from math_verify import verify as _mv_verify

from rlvr.verifiers import Outcome

SCAN_CHARS = 20_000  # only the tail of a completion is searched for its answer
MAX_ANSWER_CHARS = 500  # longer extracted answers skip math_verify (string comparison only)
MAX_NESTING = 20  # deeper bracket / argument nesting skips math_verify
MAX_DIGITS = 10_000  # answers that could evaluate to a number with more digits skip math_verify
DEADLINE_S = 0.5  # wall-clock budget of math_verify's parse + compare for one pair
EXTRACTORS = ("boxed", "answer_line", "final_answer_phrase", "hashes", "answer_tag", "last_number")
# last_number and answer_tag are opt-in: a lenient last number would reward any text ending in it
DEFAULT_EXTRACT = ("boxed", "answer_line", "final_answer_phrase", "hashes")

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_BRACE_TOKENS = re.compile(r"\\boxed|\\fbox|\\[{}]|[{}]")  # one token per match: no backtracking
_ANSWER_LINE = re.compile(r"answer[ \t*]*[:\uff1a][ \t]*([^\n]*)", re.IGNORECASE)
_HASHES_LINE = re.compile(r"####[ \t]*([^\n]*)")
# "the final answer is", "The answer is:", "Final answer:" -- each run is bounded by a literal after it
_ANSWER_PHRASE = re.compile(r"\banswer(?:[ \t]+is\b|[ \t*]*[:\uff1a])[ \t*]*[:\uff1a]?", re.IGNORECASE)
_SENTENCE_END = re.compile(r"(?<!\.)\.(?=\s)")  # "16. I hope" ends at "16"; "3.5" and "..." do not end
_LAST_NUMBER = re.compile(r"(?:(?<![\w)\]}])-)?\d+(?:,\d{3}(?!\d))*(?:\.\d+)?")  # "9-3" ends in 3, "x = -3" in -3
_NUM = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)"  # unambiguous: no backtracking over a digit run
_NUMBER = re.compile(_NUM)
_RATIO = re.compile(r"(-?)\\frac\{(-?\d{1,100})\}\{(-?\d{1,100})\}|(-?\d{1,100}) ?/ ?(\d{1,100})")
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(?:(?:,|\{,\}|\\,|\\ |~| )\d{3})+(?:\.\d+)?")
_SEPARATOR = re.compile(r",|\{,\}|\\,|\\ |~| ")
_SCIENTIFIC = re.compile(_NUM + r"[eE][+-]?\d{1,2}")
_TEXT_WRAP = re.compile(r"\\(?:text|textbf|mbox|mathrm)\{([^{}]{0,100})\}")
_TRAILING_TEXT = re.compile(r"(?<=\S)\s*\\(?:text|mbox|mathrm)\{[^{}]{0,100}\}$")
_TRAILING_WORDS = re.compile(rf"({_NUM}) [A-Za-z]{{2,20}}(?: [A-Za-z]{{1,20}}){{0,3}}")  # "42 apples"
_SPACES = re.compile(r"\s+")


# --- extraction ---------------------------------------------------------------------------------


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


def _phrase(text: str) -> str | None:
    """After the last "answer is" / "answer:", to the end of its sentence or line, unwrapped."""
    end = None
    for m in _ANSWER_PHRASE.finditer(text):
        end = m.end()
    if end is None:
        return None
    line_end = text.find("\n", end)
    found = _SENTENCE_END.split(text[end : line_end if line_end >= 0 else len(text)], maxsplit=1)[0]
    for _ in range(3):  # "**$\frac{1}{2}$**." -> \frac{1}{2}
        found = found.strip().rstrip(".").strip().strip("*$").strip()
        for left, right in (("\\(", "\\)"), ("\\[", "\\]")):
            if found.startswith(left) and found.endswith(right):
                found = found[len(left) : -len(right)]
    return found or None


def _answer_tag(text: str) -> str | None:
    close = text.rfind("</answer>")
    start = text.rfind("<answer>", 0, close) if close >= 0 else -1
    if start < 0:
        return None
    return text[start + len("<answer>") : close].strip() or None


def _last_number(text: str) -> str | None:
    found = None
    for m in _LAST_NUMBER.finditer(text):
        found = m.group()
    return found


def _checked(extractors: Iterable[str]) -> tuple[str, ...]:
    names = () if isinstance(extractors, str) else tuple(extractors)
    unknown = [name for name in names if name not in EXTRACTORS]
    if unknown or not names:
        what = f"unknown answer extractor(s) {unknown}" if unknown else f"no answer extractors in {extractors!r}"
        raise ValueError(f"{what}; valid (a non-empty tuple, tried in order): {', '.join(EXTRACTORS)}")
    return names


def extract_answer(text: str, *, extractors: Iterable[str] = DEFAULT_EXTRACT) -> str | None:
    """The final answer of a completion: the first of `extractors` (in order) that finds one; None if none does.

    "boxed": the last complete `\\boxed{...}` or `\\fbox{...}` (an unclosed one is skipped);
    "answer_line": the rest of the last line containing "Answer:" (any case);
    "final_answer_phrase": after the last "answer is" / "answer:" ("The final answer is 16."), to the end
      of that sentence or line, without a trailing period, `$`, `**`;
    "hashes": the rest of the last "####" line (GSM8K);
    "answer_tag": the content of the last `<answer>...</answer>`;
    "last_number": the last number in the text (a lenient fallback).
    A found `\\boxed{x}` is unwrapped to x. Only the last `SCAN_CHARS` characters of `text` are searched.
    ValueError for an unknown name.
    """
    window = text[-SCAN_CHARS:]
    for name in _checked(extractors):  # the one dispatch on extractor names
        if name == "boxed":
            found = _boxed(window)
        elif name == "answer_line":
            found = _last_line(_ANSWER_LINE, window)
        elif name == "final_answer_phrase":
            found = _phrase(window)
        elif name == "hashes":
            found = _last_line(_HASHES_LINE, window)
        elif name == "answer_tag":
            found = _answer_tag(window)
        else:
            found = _last_number(window)
        for _ in range(3):  # `\boxed{\boxed{9}}` -> 9; a few levels, not an unbounded loop
            if found and found.startswith(_BOX_COMMANDS) and found.endswith("}"):
                found = _boxed(found) or found
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


# --- refusing answers that sympy could not finish -------------------------------------------------

_TOKEN = re.compile(r"\\[A-Za-z]+|\\.|\d+(?:\.\d+)?|\s+|.", re.DOTALL)  # one token per match
# evaluated while parsing: \operatorname{zeros}(n, n) and the like; substitution f|_{x=a}
_EAGER = re.compile(r"\\operatorname|(?:\||\\[lr]?vert)\s*[_^]\s*\{[^{}]*=")
_OPEN = frozenset("{([") | {"\\{", "\\lbrace", "\\langle", "\\lfloor", "\\lceil", "\\lgroup"}
_CLOSE = frozenset("})]") | {"\\}", "\\rbrace", "\\rangle", "\\rfloor", "\\rceil", "\\rgroup"}
_TWO_ARGS = frozenset({"\\frac", "\\dfrac", "\\tfrac", "\\cfrac"})
_BINOMS = frozenset({"\\binom", "\\dbinom", "\\tbinom"})
_BIG_OPS = frozenset({"\\sum", "\\prod", "\\int", "\\iint", "\\oint"})
_EXP_LIKE = frozenset({"\\exp", "\\sinh", "\\cosh"})  # of x: up to e^|x|
_LOG10_2, _LOG10_E = math.log10(2), math.log10(math.e)


class _TooBig(Exception):
    """The estimate passed MAX_DIGITS or MAX_NESTING: the answer is refused."""


class _Estimate:
    """Upper estimate of the digits of the numbers a LaTeX answer could evaluate to (module docstring).

    A small recursive-descent reading of the tokens: lenient (it never fails on odd LaTeX), and where
    the notation is ambiguous it takes the larger reading. Raises _TooBig early.
    """

    def __init__(self, text: str) -> None:
        self.toks = [t for t in _TOKEN.findall(text) if not t.isspace()]
        self.i = 0

    def bound(self, digits: float) -> float:
        if not digits <= MAX_DIGITS:  # also catches nan
            raise _TooBig
        return digits

    def power(self, base: float, exponent: float) -> float:
        """Digits of base^exponent, both given as digits (an exponent of d digits is at most 10^d)."""
        return self.bound(max(base, _LOG10_2) * 10.0 ** min(exponent, 300.0))

    def seq(self, depth: int, letter: float) -> float:
        """Items up to a closing bracket (not consumed) or the end; their digits add."""
        total = 0.0
        while self.i < len(self.toks) and self.toks[self.i] not in _CLOSE:
            if self.toks[self.i] == "\\choose":  # {n \choose k}: n is everything before it
                self.i += 1
                total = self.power(_LOG10_2, total) + self.seq(depth + 1, letter)
            else:
                total = self.bound(total + self.item(depth, letter))
        return total

    def item(self, depth: int, letter: float) -> float:
        """An atom and its postfixes: ^ (and **), _ and !."""
        digits = self.atom(depth, letter)
        exponents: list[float] = []
        while self.i < len(self.toks):
            tok = self.toks[self.i]
            if tok == "^" or (tok == "*" and self.toks[self.i + 1 : self.i + 2] == ["*"]):
                self.i += 1 if tok == "^" else 2
                exponents.append(self.operand(depth, letter))
            elif tok == "_":
                self.i += 1
                digits = self.bound(digits + self.operand(depth, letter))
            elif tok in ("!", "'"):
                self.i += 1
                digits = self.tower(digits, exponents)
                exponents = []
                if tok == "!":  # n! <= n^n
                    digits = self.power(max(digits, _LOG10_2), digits)
            else:
                break
        return self.tower(digits, exponents)

    def tower(self, base: float, exponents: list[float]) -> float:
        """a^b^c read as the larger of a^(b^c) and (a^b)^c."""
        if not exponents:
            return base
        right = exponents[-1]
        for e in reversed(exponents[:-1]):
            right = self.power(e, right)
        return self.power(base, max(right, sum(exponents)))  # (a^b)^c = a^(bc): exponent digits add

    def operand(self, depth: int, letter: float) -> float:
        """What a ^, _ or command takes: a bracketed group, or one (signed) atom; one level deeper."""
        while self.i < len(self.toks) and self.toks[self.i] in ("-", "+"):
            self.i += 1
        return self.atom(self.inner(depth), letter)

    def inner(self, depth: int) -> int:
        """The depth of an argument: a bracketed group counts its own level."""
        return depth if self.toks[self.i : self.i + 1] and self.toks[self.i] in _OPEN else depth + 1

    def atom(self, depth: int, letter: float) -> float:
        if depth > MAX_NESTING:
            raise _TooBig
        if self.i >= len(self.toks):
            return _LOG10_2
        tok = self.toks[self.i]
        self.i += 1
        if tok[0].isdigit():
            digits = math.log10(max(int(tok), 2)) if tok.isdigit() and len(tok) < 16 else float(len(tok))
            if self.toks[self.i : self.i + 1] in (["e"], ["E"]):  # 1e99999: 10^99999
                j = self.i + 1 + (self.toks[self.i + 1 : self.i + 2] in (["-"], ["+"]))
                if j < len(self.toks) and self.toks[j].isdigit():
                    digits += float(self.toks[j][:6]) if len(self.toks[j]) < 6 else math.inf
                    self.i = j + 1
            return self.bound(digits)
        if tok in _OPEN:
            digits = self.seq(depth + 1, letter)
            self.i += self.i < len(self.toks)  # the closing bracket, whichever it is ([1,2) is an interval)
            return max(digits, _LOG10_2)
        if tok in _TWO_ARGS:
            return self.bound(self.operand(depth, letter) + self.operand(depth, letter))
        if tok in _BINOMS:  # C(n, k) <= 2^n
            n = self.operand(depth, letter)
            return self.power(_LOG10_2, n) + self.operand(depth, letter)
        if tok == "\\sqrt":  # \sqrt[n]{x} is x^(1/n): n is evaluated
            index = self.atom(depth, letter) if self.toks[self.i : self.i + 1] == ["["] else 0.0
            return self.bound(index + self.operand(depth, letter))
        if tok in _EXP_LIKE:
            return self.power(_LOG10_E, self.item(self.inner(depth), letter))
        if tok == "\\Gamma":  # Gamma(n) = (n-1)!
            n = self.item(self.inner(depth), letter)
            return self.power(n, n)
        if tok in _BIG_OPS:  # limits, then the body: the rest of the group
            limits = 0.0
            while self.toks[self.i : self.i + 1] in (["_"], ["^"]):
                self.i += 1
                limits = max(limits, self.operand(depth, letter))
            body = self.seq(depth + 1, max(letter, limits))  # the index variable runs up to the limit
            return self.power(body, limits) if tok == "\\prod" else self.bound(limits + body)
        if tok.startswith("\\") or tok.isalpha():
            return letter  # a symbol, constant or function name: at most 10 (or the running index)
        return 0.0  # operators and punctuation


def _refused(answer: str) -> bool:
    """True if sympy must not see `answer` (the rules in the module docstring)."""
    if _EAGER.search(answer):
        return True
    estimate = _Estimate(answer)
    try:
        while estimate.i < len(estimate.toks):  # unbalanced closing brackets end a seq: skip them
            estimate.seq(0, 1.0)
            estimate.i += 1
    except _TooBig:
        return True
    return False


class _OutOfTime(BaseException):
    """Raised by the deadline tracer; a BaseException so that math_verify's and sympy's
    `except Exception` blocks cannot swallow it."""


_UNRAISABLE_FLAGS = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR
_CLEANUP = frozenset({"__exit__", "__aexit__", "__del__"})


def _interruptible(frame) -> bool:
    """Whether an exception raised as `frame` starts reaches `_within_deadline` and leaves nothing
    half-done. Not: inside an import (sympy imports lazily; a module would stay half-initialized), in a
    context manager's exit or a finalizer (the cleanup would be skipped), as a generator resumes (the
    garbage collector closes generators: the exception would be printed and dropped), or in a weakref
    callback. The deadline then waits for the next call."""
    if frame.f_code.co_flags & _UNRAISABLE_FLAGS:
        return False
    while frame is not None and frame.f_code is not _within_deadline.__code__:
        code = frame.f_code
        if code.co_name in _CLEANUP or code.co_filename.startswith("<frozen importlib"):
            return False
        if code.co_filename.endswith(("weakref.py", "_weakrefset.py")):
            return False
        frame = frame.f_back
    return True


def _within_deadline(fn, *args):
    """fn(*args), stopped with _OutOfTime once DEADLINE_S has passed (Python code only: C calls finish first)."""
    end = time.monotonic() + DEADLINE_S
    previous = sys.gettrace()  # a debugger's or coverage's tracer keeps working underneath

    def tracer(frame, event, arg):  # called at every Python function call in this thread
        if time.monotonic() > end and _interruptible(frame):
            raise _OutOfTime  # CPython then removes the tracer; the finally below restores the previous one
        return previous(frame, event, arg) if previous is not None else None

    sys.settrace(tracer)
    try:
        return fn(*args)
    finally:
        sys.settrace(previous)


# --- comparison ---------------------------------------------------------------------------------


def _as_fraction(s: str) -> Fraction | None:
    """A plain number, `\\frac{p}{q}` or `p/q` (integers) as an exact fraction; None for anything else."""
    if _NUMBER.fullmatch(s):
        return Fraction(s)
    if (m := _RATIO.fullmatch(s)) and int(m[3] or m[5]):
        return Fraction(int(m[2] or m[4]), int(m[3] or m[5])) * (-1 if m[1] else 1)
    return None


def _parse_uncached(answer: str) -> list:
    """math_verify's parse of one answer (normalized), SIGALRM timeout disabled."""
    return _mv_parse(f"${answer}$", parsing_timeout=None)  # type: ignore[arg-type]


# The caches wrap plain functions (rather than decorating them) so that `make mutation` can mutate their bodies:
# mutmut leaves decorated functions alone.
_parse = functools.lru_cache(maxsize=8192)(_parse_uncached)


def _sympy_equivalent(pred: str, gold: str) -> bool:
    gold_parsed, pred_parsed = _parse(gold), _parse(pred)
    if all(isinstance(x, str) for x in gold_parsed) or all(isinstance(x, str) for x in pred_parsed):
        return False  # math_verify could not parse a side: the strict comparison was the answer
    return bool(_mv_verify(gold_parsed, pred_parsed, timeout_seconds=None))


@functools.cache
def _warm_up() -> None:
    """sympy imports parts of itself on first use; pay that once per process, outside the deadline."""
    for pred, gold in (
        ("(x+1)^2", "x^2+2x+1"),
        ("\\sin^2 x+\\cos^2 x", "1"),
        ("x=3", "3"),
        ("[1,2)", "\\{1,2\\}"),
        ("\\frac{\\sqrt{3}}{2}", "0.866"),
        ("e^{-x^{2}}", "2\\pi"),
        ("\\log_2 8", "\\binom{5}{2}"),
    ):
        _sympy_equivalent(pred, gold)


def _equivalent_uncached(pred: str, gold: str) -> bool:
    """Whether two normalized answers are equal; raises _OutOfTime if math_verify runs past the deadline."""
    if not pred or not gold:
        return False
    if pred.replace(" ", "") == gold.replace(" ", ""):
        return True  # strict: normalized string equality
    if len(pred) > MAX_ANSWER_CHARS or len(gold) > MAX_ANSWER_CHARS:
        return False
    pf, gf = _as_fraction(pred), _as_fraction(gold)
    if pf is not None and gf is not None:  # both plain numbers or fractions: exact, no sympy
        if pf == gf or "." not in pred + gold:
            return pf == gf  # (decimals that differ still go to math_verify, which rounds)
    if _refused(pred) or _refused(gold):
        return False  # the strict comparison above was the answer
    _warm_up()
    return _within_deadline(_sympy_equivalent, pred, gold)


_equivalent_normalized = functools.lru_cache(maxsize=8192)(_equivalent_uncached)  # _OutOfTime is not cached


def _judge(completion: str, answer: str, extract: Iterable[str]) -> bool | None:
    """None if no answer can be extracted, else whether it equals `answer`."""
    extracted = extract_answer(completion, extractors=extract)
    if extracted is None:
        return None
    try:
        return _equivalent_normalized(normalize(extracted), normalize(answer))
    except _OutOfTime:
        return False


def is_equivalent(completion: str, answer: str, *, extract: Iterable[str] = DEFAULT_EXTRACT) -> bool:
    """True if the final answer extracted from `completion` equals the ground truth `answer`."""
    return _judge(completion, answer, extract) is True


def verify(completion: str, answer: str, *, extract: Iterable[str] = DEFAULT_EXTRACT) -> Outcome:
    """NO_ANSWER if no final answer can be extracted, else CORRECT / INCORRECT.

    Pass other extractors with `functools.partial(verify, extract=(...))` (picklable for worker pools).
    """
    same = _judge(completion, answer, extract)
    if same is None:
        return Outcome.NO_ANSWER
    return Outcome.CORRECT if same else Outcome.INCORRECT


class _DropTimeoutDisabledWarning(logging.Filter):
    """math_verify warns once per process that its timeouts are off; here that is by design."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropTimeoutDisabledWarning())


def format_score(completion: str, answer: str, *, extract: Iterable[str] = DEFAULT_EXTRACT) -> float:
    """An optional format term: 1.0 when the completion states a final answer we can extract, else 0.0.

    Use it as a weighted reward term: `'+reward.terms=[{fn: "rlvr.verifiers.math:format_score", weight: 0.1}]'`.
    """
    return 1.0 if extract_answer(completion, extractors=extract) is not None else 0.0
