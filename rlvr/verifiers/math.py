"""Verifier for free-form math answers (MATH, GSM8K, DAPO-Math style).
(~500 lines, one job: whether two math answers are equal, with the work budget that bounds sympy; the extractors
are rlvr.verifiers.extraction's.)

`verify(completion, answer, extract=...)` reads the final answer of a completion with the named extractors
(`DEFAULT_EXTRACT`: a `\\boxed{...}`, an "Answer: ..." line, "The final answer is ..." phrasings, "#### ..."; which
one wins is in `extract_answer`) and compares it with the ground truth using `math_verify` (fractions, decimals,
LaTeX, expressions, sets, intervals, units), with a strict normalized-string fallback when `math_verify` cannot parse
either side or the answer is refused (below). An answer must be marked: a completion that merely ends in a number
has NO_ANSWER by default (the opt-in `last_number` extractor is the lenient rule).

Several answers: boxes that only separators part (`\\boxed{1}, \\boxed{2}`, `$\\boxed{1}$ and $\\boxed{2}$`) are one
answer, "1, 2"; and when the gold lists n answers and the completion boxed them apart (one box each, with reasoning
between), its last n boxes are read together, unless the text between them takes one back ("not", "wrong",
"instead", "only", ...).

Conventions where answers are ambiguous (documented so the reward is predictable):
- Percent signs are dropped before comparing: `50\\%` equals `50`, not `0.5` (the MATH convention).
- Trailing units are dropped: `5 cm`, `5\\text{ cm}` and `5` are equal.
- Thousands separators (`1,000`, `1{,}000`, `1\\,000`, `1\\!,\\!000`, `11,\\! 111`, `1 000`) are dropped when the
  whole answer is one number; `1,2` elsewhere stays a list.
- Scientific notation `1.2e3` is read as the number 1200.

Verdicts depend only on (completion, gold, library versions), never on time or load: CORRECT, INCORRECT,
NO_ANSWER, or TIMEOUT when math_verify did not finish within its work budget, `WORK_CALLS` Python function calls
for both parses and the comparison (counted by `sys.settrace` in the calling thread, so it also holds off the main
thread, where math_verify's SIGALRM timeouts fail; those are off). A parse is cached with its count, and a pair that
reuses it pays that count again, so a pair's total is what it costs from scratch. Counts still depend a little on
what the process did before (the parser's tables and sympy's caches warm up) and on Python's hash seed (each
worker has its own: a few hundred calls in 100,000), so the budget sits far above what the
tests' corpus needs (its heaviest pair makes under a third of it in a fresh process) and far below what slow inputs
make: a verdict near the limit is the only one that could differ between processes. The one-off start-up work
(imports, parsing tables) is done by `warm_up`, uncounted, when a verifier worker starts. The worker pool's
wall-clock `reward.timeout_s` stays the hard bound for C code, which a count cannot stop; it also reads TIMEOUT.

Bounds on untrusted text: only the last `SCAN_CHARS` characters of a completion are scanned, with linear-time
patterns. Plain numbers compare exactly without sympy. Before sympy sees an answer (either side), it is refused --
compared as a normalized string only -- when:
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
- it raises something symbolic (a letter, function or bracket) to a power above `MAX_SYMBOLIC_EXPONENT`:
  `(x+1)^{1000}` and `\\sin(x)^{100}` expand for seconds in few Python calls, out of reach of the work budget;
- it uses what the parser evaluates eagerly, out of reach of the estimate: `\\operatorname{...}`
  (matrix constructors such as `zeros(n, n)`) and substitution bars `f|_{x=a}`.
What sympy still does slowly (simplifying, solving, parsing a long answer with its Python ANTLR parser) is Python
code: the work budget stops it (at the next Python call that is not in an import, a context manager's exit, a
finalizer or a generator). The tracer slows the sympy path about 2.5x; plain-number and string comparisons do not use
it. A raise swallowed by a bare `except:` (a few in mpmath's conversions) lets that call run on to the pool's timeout.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import re
import sys
from collections.abc import Iterable
from decimal import Decimal, InvalidOperation
from fractions import Fraction

from math_verify import parse as _mv_parse
from math_verify import verify as _mv_verify

from rlvr.verifiers import Outcome
from rlvr.verifiers.extraction import (  # noqa: F401 (DEFAULT_EXTRACT, EXTRACTORS, extract_answer: the public API)
    BOX_COMMANDS,
    DEFAULT_EXTRACT,
    EXTRACTORS,
    SCAN_CHARS,
    boxes,
    extract_answer,
    locate_answer,
)

MAX_ANSWER_CHARS = 500  # longer extracted answers skip math_verify (string comparison only)
MAX_NESTING = 20  # deeper bracket / argument nesting skips math_verify
MAX_DIGITS = 10_000  # answers that could evaluate to a number with more digits skip math_verify
MAX_GOLD_WORDS = 4  # a gold answer with more words (outside LaTeX commands) is prose, not an answer (check_gold)
MAX_SYMBOLIC_EXPONENT = 30  # a letter, function or bracket raised to a larger power skips math_verify
WORK_CALLS = 1_000_000  # Python calls math_verify may make for one pair: both parses and the comparison
_NUM = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)"  # unambiguous: no backtracking over a digit run
_NUMBER = re.compile(_NUM)
_RATIO = re.compile(r"(-?)\\frac\{(-?\d{1,100})\}\{(-?\d{1,100})\}|(-?\d{1,100}) ?/ ?(\d{1,100})")
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(?:(?:,|\{,\}|\\,|\\ |~| )\d{3})+(?:\.\d+)?")
_SEPARATOR = re.compile(r",|\{,\}|\\,|\\ |~| ")
_SCIENTIFIC = re.compile(_NUM + r"[eE][+-]?\d{1,2}")
_TEXT_WRAP = re.compile(r"\\(?:text|textbf|mbox|mathrm)\{([^{}]{0,100})\}")
_TRAILING_TEXT = re.compile(r"(?<=\S)\s*\\(?:text|mbox|mathrm)\{[^{}]{0,100}\}(?:\^\{?[23]\}?)?$")  # "24\text{ cm}^2"
# "42 apples", "60 km/h", "2,000 people"
_TRAILING_WORDS = re.compile(rf"([+-]?\d{{1,3}}(?:,\d{{3}})+(?:\.\d+)?|{_NUM}) [A-Za-z][A-Za-z/]{{1,20}}(?: [A-Za-z/]{{1,20}}){{0,3}}")
_SPACES = re.compile(r"\s+")
_COMMAND = re.compile(r"\\[A-Za-z]+")  # a LaTeX command name
_WORD = re.compile(r"[A-Za-z]{2,}")
_NEGATIVE_SPACE = re.compile(r"\\!\s*")


def normalize(answer: str) -> str:
    """Canonical spelling of an answer: the conventions in the module docstring, spaces collapsed."""
    s = answer.strip()
    if len(s) > MAX_ANSWER_CHARS:
        return s  # too long to be a real answer: compared verbatim, no regex work on it
    s = s.replace("\\$", "").replace("$", "").replace("\\left", "").replace("\\right", "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("\\displaystyle", "")
    s = s.replace("\\%", "").replace("%", "")
    s = _NEGATIVE_SPACE.sub("", s)  # `11,\! 111` -> 11,111 (LaTeX's thousands spacing)
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
# a power of something symbolic: sympy expands (x+1)^{1000} or \\sin(x)^{100} in few Python calls but many seconds
# words that take back a boxed answer before the next one
_RETRACTED = re.compile(r"\b(?:not|no|wrong|incorrect|mistake|instead|actually|only|wait|oops|rather)\b", re.IGNORECASE)
_LIMITS = re.compile(r"\\(?:sum|prod|int|iint|oint)[ \t]*(?:_(?:\{[^{}]*\}|\S))?[ \t]*(?:\^(?:\{[^{}]*\}|\S))?")  # not powers
_SYMBOLIC_POWER = re.compile(r"(?:[A-Za-z)\]}]|\\[A-Za-z]+)[ \t]*(?:\^|\*\*)[ \t]*[{(]?[ \t]*(\d{1,9})")
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
        if tok[0].isdecimal():  # ("²".isdigit() is True, but int("²") fails)
            digits = math.log10(max(int(tok), 2)) if tok.isdecimal() and len(tok) < 16 else float(len(tok))
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
    if any(int(m[1]) > MAX_SYMBOLIC_EXPONENT for m in _SYMBOLIC_POWER.finditer(_LIMITS.sub(" ", answer))):
        return True
    estimate = _Estimate(answer)
    try:
        while estimate.i < len(estimate.toks):  # unbalanced closing brackets end a seq: skip them
            estimate.seq(0, 1.0)
            estimate.i += 1
    except _TooBig:
        return True
    return False


class _OverBudget(BaseException):
    """Raised by the work-budget tracer; a BaseException so that math_verify's and sympy's `except Exception` blocks
    cannot swallow it."""


_UNRAISABLE_FLAGS = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR
_CLEANUP = frozenset({"__exit__", "__aexit__", "__del__"})


def _interruptible(frame) -> bool:
    """Whether an exception raised as `frame` starts reaches `_counted` and leaves nothing half-done. Not: inside an
    import (sympy imports lazily; a module would stay half-initialized), in a context manager's exit or a finalizer
    (the cleanup would be skipped), as a generator resumes (the garbage collector closes generators: the exception
    would be printed and dropped), or in a weakref callback. The budget then waits for the next call."""
    if frame.f_code.co_flags & _UNRAISABLE_FLAGS:
        return False
    while frame is not None and frame.f_code is not _counted.__code__:
        code = frame.f_code
        if code.co_name in _CLEANUP or code.co_filename.startswith("<frozen importlib"):
            return False
        if code.co_filename.endswith(("weakref.py", "_weakrefset.py")):
            return False
        frame = frame.f_back
    return True


def _counted(budget: int, fn, *args) -> tuple[object, int]:
    """(fn(*args), the Python calls it made); _OverBudget once it makes more than `budget` calls (counted at every
    Python function call in this thread; C calls finish first)."""
    calls = 0
    previous = sys.gettrace()  # a debugger's or coverage's tracer keeps working underneath

    def tracer(frame, event, arg):
        nonlocal calls
        calls += 1
        if calls > budget and _interruptible(frame):
            raise _OverBudget  # CPython then removes the tracer; the finally below restores the previous one
        return previous(frame, event, arg) if previous is not None else None

    sys.settrace(tracer)
    try:
        return fn(*args), calls
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


def _parse_uncached(answer: str) -> tuple[list | None, int]:
    """(math_verify's parse of one normalized answer, the calls it took), or (None, calls) past WORK_CALLS."""
    try:
        return _counted(WORK_CALLS, functools.partial(_mv_parse, parsing_timeout=None), f"${answer}$")  # type: ignore
    except _OverBudget:
        return None, WORK_CALLS + 1


# The caches wrap plain functions (rather than decorating them) so that `make mutation` can mutate their bodies:
# mutmut leaves decorated functions alone. A cached parse keeps its cost, which every pair that uses it pays again.
_parse = functools.lru_cache(maxsize=8192)(_parse_uncached)


def _sympy_equivalent(pred: str, gold: str) -> Outcome:
    """math_verify's verdict on two normalized answers, within WORK_CALLS calls for both parses and the comparison."""
    (gold_parsed, gold_calls), (pred_parsed, pred_calls) = _parse(gold), _parse(pred)
    left = WORK_CALLS - gold_calls - pred_calls
    if gold_parsed is None or pred_parsed is None or left <= 0:
        return Outcome.TIMEOUT
    if all(isinstance(x, str) for x in gold_parsed) or all(isinstance(x, str) for x in pred_parsed):
        return Outcome.INCORRECT  # math_verify could not parse a side: the strict comparison was the answer
    try:
        same, _ = _counted(left, functools.partial(_mv_verify, timeout_seconds=None), gold_parsed, pred_parsed)
    except _OverBudget:
        return Outcome.TIMEOUT
    return Outcome.CORRECT if same else Outcome.INCORRECT


def _warm_up() -> None:
    """sympy, the LaTeX parser and math_verify import parts of themselves and build their parsing tables on first use
    (~1 s): pay that once per process, uncounted, before any pair is counted. Verifier workers call it as they start."""
    for pred, gold in _WARM_UP_PAIRS:
        _mv_verify(_mv_parse(f"${gold}$", parsing_timeout=None), _mv_parse(f"${pred}$", parsing_timeout=None),
                   timeout_seconds=None)  # fmt: skip


_WARM_UP_PAIRS = (
    ("(x+1)^2", "x^2+2x+1"),
    ("\\sin^2 x+\\cos^2 x", "1"),
    ("x=3", "3"),
    ("[1,2)", "\\{1,2\\}"),
    ("(-\\infty, 3) \\cup (5, \\infty)", "(5, \\infty)"),
    ("\\frac{\\sqrt{3}}{2}", "0.866"),
    ("e^{-x^{2}}", "2\\pi"),
    ("\\log_2 8", "\\binom{5}{2}"),
    ("1, 2", "\\{2, 1\\}"),
    ("2:3", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}"),
    ("10^\\circ", "x \\le 3"),
    ("3+4i", "\\frac{\\pi}{4}"),
)
_warmed = functools.cache(_warm_up)
warm_up = _warmed  # what a verifier worker calls as it starts (rlvr.verifiers.pool)


def _equivalent_uncached(pred: str, gold: str) -> Outcome:
    """CORRECT if two normalized answers are equal, INCORRECT if not, TIMEOUT if math_verify ran past WORK_CALLS."""
    if not pred or not gold:
        return Outcome.INCORRECT
    if pred.replace(" ", "") == gold.replace(" ", ""):
        return Outcome.CORRECT  # strict: normalized string equality
    if len(pred) > MAX_ANSWER_CHARS or len(gold) > MAX_ANSWER_CHARS:
        return Outcome.INCORRECT
    pf, gf = _as_fraction(pred), _as_fraction(gold)
    if pf is not None and gf is not None:  # both plain numbers or fractions: exact, no sympy
        if pf == gf or "." not in pred + gold:
            return Outcome.CORRECT if pf == gf else Outcome.INCORRECT  # (decimals that differ go to math_verify)
    if _refused(pred) or _refused(gold):
        return Outcome.INCORRECT  # the strict comparison above was the answer
    _warmed()
    return _sympy_equivalent(pred, gold)


_equivalent_normalized = functools.lru_cache(maxsize=8192)(_equivalent_uncached)  # a verdict, TIMEOUT too, is final


def _items(answer: str) -> int:
    """How many answers a normalized answer lists: its top-level commas + 1 (inside `\\{...\\}` if it is one set)."""
    if answer.startswith("\\{") and answer.endswith("\\}"):
        answer = answer[2:-2]
    depth, items = 0, 1
    for token in _TOKEN.findall(answer):
        if token in _OPEN:
            depth += 1
        elif token in _CLOSE:
            depth -= 1
        elif token == "," and depth == 0:
            items += 1
    return items


def _judge(completion: str, answer: str, extract: Iterable[str]) -> Outcome:
    """The Outcome of one completion against its ground truth (the module docstring)."""
    found = locate_answer(completion, extract)
    if found is None:
        return Outcome.NO_ANSWER
    name, extracted = found
    gold = normalize(answer)
    outcome = _equivalent_normalized(normalize(extracted), gold)
    n = _items(gold)
    if outcome is Outcome.INCORRECT and name == "boxed" and n > 1 and _items(normalize(extracted)) < n:
        # the gold lists n answers and the completion boxed them one by one, apart: its last n boxes are the answer,
        # unless the text between them takes one back ("\boxed{1}. That's wrong; the only root is \boxed{2}")
        window = completion[-SCAN_CHARS:]
        last = boxes(window)[-n:]
        between = [window[left[2] : right[0]] for left, right in zip(last, last[1:])]
        if (len(last) == n and all(_items(normalize(content)) == 1 for _, content, _ in last)
                and not any(_RETRACTED.search(gap) for gap in between)):  # fmt: skip
            outcome = _equivalent_normalized(normalize(", ".join(content for _, content, _ in last)), gold)
    return outcome


def is_equivalent(completion: str, answer: str, *, extract: Iterable[str] = DEFAULT_EXTRACT) -> bool:
    """True if the final answer extracted from `completion` equals the ground truth `answer`."""
    return _judge(completion, answer, extract) is Outcome.CORRECT


def verify(completion: str, answer: str, *, extract: Iterable[str] = DEFAULT_EXTRACT) -> Outcome:
    """NO_ANSWER if no final answer can be extracted, TIMEOUT if the comparison ran out of its work budget, else
    CORRECT / INCORRECT.

    Pass other extractors with `functools.partial(verify, extract=(...))` (picklable for worker pools).
    """
    return _judge(completion, answer, extract)


def check_gold(answer: str) -> Outcome:
    """The verdict on a perfect completion for this gold answer: `The final answer is $\\boxed{answer}$.`. NO_ANSWER
    when the gold is not an answer at all: empty, several lines, longer than MAX_ANSWER_CHARS, a solution that still
    holds its own `\\boxed{}` or `####` (data.answer_extract reduces a solution to its answer), a question, or prose
    (more than MAX_GOLD_WORDS words outside LaTeX commands: a question or a solution's sentence, as when
    data.answer_key names the wrong field)."""
    text = answer.strip()
    solution = "####" in text or any(command in text for command in BOX_COMMANDS)
    if not text or "\n" in text or len(text) > MAX_ANSWER_CHARS or solution or text.endswith("?"):
        return Outcome.NO_ANSWER
    if len(_WORD.findall(_COMMAND.sub(" ", text))) > MAX_GOLD_WORDS:
        return Outcome.NO_ANSWER
    return verify(f"The final answer is $\\boxed{{{text}}}$.", answer)


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
