"""Where a completion states its final answer: the answer extractors of the math verifier (and of the gym verifier's
`reward.extract`). Pure text scanning, linear in the scanned tail; no sympy.

`extract_answer(text, extractors=...)` names the rule: each extractor finds the last statement of its kind; a box,
"####", `<answer>` and a statement of the *final* answer are explicit, "Answer:" and "the answer is" alone are plain;
the explicit statement that comes last wins, then the plain one that comes last, `last_number` only when nothing
else is found. Boxes that only separators part are one answer (`\\boxed{1}, \\boxed{2}` reads "1, 2").
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import NamedTuple

from rlvr.choices import Extractor

SCAN_CHARS = 20_000  # only the tail of a completion is searched for its answer
EXTRACTORS = tuple(e.value for e in Extractor)  # reward.extract's names (rlvr.choices)
# last_number and answer_tag are opt-in: a lenient last number would reward any text ending in it
DEFAULT_EXTRACT = ("boxed", "answer_line", "final_answer_phrase", "hashes")

BOX_COMMANDS = ("\\boxed", "\\fbox")
_BRACE_TOKENS = re.compile(r"\\boxed|\\fbox|\\[{}]|[{}]")  # one token per match: no backtracking
_ANSWER_LINE = re.compile(r"answer[ \t*]*(?:[:\uff1a]|\.(?=[ \t*]*[$\\\d-]))[ \t]*([^\n]*)", re.IGNORECASE)
_FINAL_BEFORE = re.compile(r"final[ \t*_]*$", re.IGNORECASE)  # "Final Answer:" (searched just before "Answer")
_HASHES_LINE = re.compile(r"(?<!#)####(?!#)[ \t]*([^\n]*)")  # GSM8K's "#### 72" (a "#### Heading" is no answer)
# "the final answer is", "the final answer to part (a) is", "The answer is:", "Final answer:"; bounded runs only
_JUDGEMENT = r"(?![ \t]+(?:not|consistent|correct|right|reasonable|valid|indeed|plausible|confirmed|verified|wrong|incorrect)\b)"
_ANSWER_PHRASE = re.compile(
    rf"\b(?:(?P<final>final)[ \t]+answer\b[^\n.:\uff1a]{{0,100}}?[ \t]is\b{_JUDGEMENT}|answer[ \t]+is\b{_JUDGEMENT}"
    r"|(?:(?P<final2>final)[ \t*]+)?answer[ \t*]*(?:[:\uff1a]|\.(?=[ \t*]*[$\\\d-])))[ \t*]*[:\uff1a]?",
    re.IGNORECASE,
)
# a line that is only a "Final Answer" heading ("### Final Answer", "**Final Answer**"): the answer is on the next line
_FINAL_HEADING = re.compile(r"^[ \t#*]*final[ \t]+answer[ \t*:.]*$", re.IGNORECASE | re.MULTILINE)
_SENTENCE_END = re.compile(r"(?<!\.)\.(?=\s)")  # "16. I hope" ends at "16"; "3.5" and "..." do not end
# inline or display math, bounded: "$5$", "\(5\)", "$$5$$", "\[5\]"
_INLINE_MATH = re.compile(r"\$\$([^$]{1,300}?)\$\$|\$([^$\n]{1,300})\$|\\\((.{1,300}?)\\\)|\\\[(.{1,300}?)\\\]")
_DISPLAY_AFTER = re.compile(r"\s*+(?:\$\$([^$]{1,300}?)\$\$|\\\[(.{1,300}?)\\\])", re.DOTALL)  # possessive: linear
_CLAUSE = re.compile(r",[ \t]+(?=(?!and\b|or\b)[A-Za-z]{2,}\b)")  # ", since ...", ", which ..." (not ", and", ", x = 1")
_PROSE = re.compile(r"[ \t*]+[A-Za-z]|[ \t*]*\([ \t]*[A-Za-z][A-Za-z \t]*\)")  # words after the math, or "(in cm)"
# "There are 9 divisors" -> 9 divisors; a hedge ("probably 3", "not 3", "maybe 3") is not a statement of the answer
_WORDS_THEN_NUMBER = re.compile(
    r"[ \t*]*(?:(?!(?:probably|maybe|perhaps|possibly|likely|not|either)\b)[A-Za-z][A-Za-z']*[ \t]+){1,6}"
    r"\**(-?\d[\d,]*(?:\.\d+)?)\b",
    re.IGNORECASE,
)
# "The largest $n$ is 34": the value a statement's subject "is" (math or a number, after "approximately" at most)
_IS_VALUE = re.compile(r"\bis[ \t*:]+(?:(?:approximately|exactly|precisely|equal[ \t]+to)[ \t]+)?"
                       r"(?=[$\\\d]|[-+][ \t]*[$\\\d])", re.IGNORECASE)
# a subject that hedges, supposes or gives a reason does not state the answer ("If $x$ is 3", "$6$ because $y$ is 2")
# ("When $x$ is 3" supposes; "The remainder when $2^{100}$ is divided by 7 is 2" does not)
_NOT_A_SUBJECT = re.compile(r"\b(?:probably|maybe|perhaps|possibly|likely|guess|suppose|if|whether|unless|because|since"
                            r"|as|but)\b|^[^A-Za-z]*(?:when|where|while)\b", re.IGNORECASE)
_FIRST_VALUE = re.compile(r"[$\d]|\\[(\[]")
_THEN = re.compile(r"\b(?:so|then|thus|hence|therefore)\b", re.IGNORECASE)
_POINTERS = frozenset({"see", "above", "below", "as", "shown", "earlier", "previous", "same"})
_LAST_NUMBER = re.compile(r"(?:(?<![\w)\]}])-)?\d+(?:,\d{3}(?!\d))*(?:\.\d+)?")  # "9-3" ends in 3, "x = -3" in -3


# between two boxes that are one answer: spaces, commas, "and"/"or", math delimiters, LaTeX spacing
_BOX_SEPARATOR = re.compile(r"(?:[\s,;&$]|\\[,;:! ]|\\q?quad|\\[()\[\]]|\\(?:text|mathrm)\{[\s,;]*(?:and|or)?[\s,;]*\}"
                            r"|\band\b|\bor\b)*")
MAX_BOX_GAP = 40  # characters between two boxes read as one answer
EXPLICIT, PLAIN, FALLBACK = 2, 1, 0  # how firmly a marker says "this is the final answer"


class _Found(NamedTuple):
    tier: int  # EXPLICIT, PLAIN or FALLBACK
    at: int  # where its marker starts in the scanned window
    text: str


def boxes(text: str) -> list[tuple[int, str, int]]:
    """(command start, stripped content, end) of every complete `\\boxed{...}` / `\\fbox{...}` not inside another
    complete one, in order: one linear scan with a brace stack (an unclosed box is skipped; a box inside it counts)."""
    stack: list[tuple[int, int] | None] = []  # per open brace: (command start, content start) if it opens a box
    pending: tuple[int, int] | None = None  # (start, end) of the last box command; its next `{` opens a box
    done: list[tuple[int, int, int]] = []  # (command start, content start, content end), outermost so far
    for m in _BRACE_TOKENS.finditer(text):
        tok = m.group()
        if tok in BOX_COMMANDS:
            pending = (m.start(), m.end())
        elif tok == "{":
            opens_box = pending is not None and not text[pending[1] : m.start()].strip()
            stack.append((pending[0], m.end()) if opens_box and pending is not None else None)
            pending = None
        elif tok == "}":
            box = stack.pop() if stack else None
            if box is not None:
                while done and done[-1][0] >= box[1]:  # boxes inside this one
                    done.pop()
                done.append((box[0], box[1], m.start()))
        # escaped braces `\{` `\}` are literal characters and match nothing
    return [(at, text[start:end].strip(), end + 1) for at, start, end in done]


def _box_group(text: str) -> _Found | None:
    """The last box, with the boxes just before it that only separators part (`\\boxed{1}, \\boxed{2}`, `$\\boxed{1}$
    and $\\boxed{2}$`): one answer, their contents joined by ", " (a repeated content counts once)."""
    every = boxes(text)
    if not every:
        return None
    first = len(every) - 1
    while first > 0:
        gap = text[every[first - 1][2] : every[first][0]]
        if len(gap) > MAX_BOX_GAP or not _BOX_SEPARATOR.fullmatch(gap):
            break
        first -= 1
    contents = list(dict.fromkeys(content for _, content, _ in every[first:] if content))
    return _Found(EXPLICIT, every[-1][0], ", ".join(contents)) if contents else None


def _predicate(sentence: str) -> str | None:
    """What a sentence says its subject is, when that is math or a number: "The volume of $ABCDEFGH$ is 120" -> 120,
    "The largest $n$ is $34$" -> $34$; None when no "is" outside math is followed by one, or the subject hedges,
    supposes or gives a reason ("If $x$ is 3", "The answer is probably 3", "is consistent with $x = 3$")."""
    spans = [m.span() for m in _INLINE_MATH.finditer(sentence)]
    for m in _IS_VALUE.finditer(sentence):
        if any(start <= m.start() < end for start, end in spans):
            continue  # "is" inside math ("$\\text{it is } 5$")
        stated = _FIRST_VALUE.search(sentence, 0, m.start())  # "$x = 3$, so $y$ is 5": y is not the answer
        if _NOT_A_SUBJECT.search(sentence, 0, m.start()) or (stated and _THEN.search(sentence, stated.end(), m.start())):
            return None
        return sentence[m.end() :]
    return None


def _tidy(found: str, *, sentence: bool = False) -> str:
    """An answer stated in prose, cut at the end of its sentence and unwrapped: "**$\\frac{1}{2}$**." -> \\frac{1}{2},
    "$12$ (in cm)" -> 12; the math or number after at most a few words ("therefore $5$" -> 5, "There are 9 divisors" -> 9 divisors), math
    joined to it by separators only ("$3$ and $5$" -> "3, 5"), and what leads before a clause ("$8$ students, since
    ..." -> 8, "15, since 30/2 = 15" -> 15). With `sentence` (a whole sentence, as after "Final Answer:"), a
    subject followed by "is <math or number>" gives that value (_predicate)."""
    found = _SENTENCE_END.split(found, maxsplit=1)[0]
    if sentence and (value := _predicate(found)) is not None:
        found = value
    found = _CLAUSE.split(found, maxsplit=1)[0]
    spans = list(_INLINE_MATH.finditer(found))
    before = found[: spans[0].start()] if spans else ""
    if spans and not any(c.isdigit() for c in before) and len(before.split()) <= 4:
        joined = [spans[0]]
        for span in spans[1:]:
            if not _BOX_SEPARATOR.fullmatch(found[joined[-1].end() : span.start()]):
                break
            joined.append(span)
        prose_after = _PROSE.match(found, joined[-1].end()) is not None
        if before.strip(" *") or len(joined) > 1 or prose_after:  # else the unwrapping below reads it
            found = ", ".join(next(g for g in span.groups() if g is not None).strip() for span in joined)
    elif m := _WORDS_THEN_NUMBER.match(found):  # "There are 9 positive divisors" -> "9 positive divisors"
        found = found[m.start(1) :]
    for _ in range(3):
        found = found.strip().rstrip(".").strip().strip("*$").strip()
        for left, right in (("\\(", "\\)"), ("\\[", "\\]")):
            if found.startswith(left) and found.endswith(right):
                found = found[len(left) : -len(right)]
    return found


def _stated(text: str, start: int, *, sentence: bool = False) -> str:
    """What is stated from `start` to the end of its sentence or line (_tidy; `sentence`: it starts a sentence); when
    the line ends there (or opens a display), the display math that follows: "The answer is:\\n\\[ x = 5 \\]" -> x = 5."""
    line_end = text.find("\n", start)
    rest = text[start : line_end if line_end >= 0 else len(text)]
    if rest.strip().strip("*") in ("", "$$", "\\["):
        opener = start + len(rest) - len(rest.lstrip(" \t*"))  # at the display's opener, or the line's end
        display = _DISPLAY_AFTER.match(text, opener)
        return _tidy(next(g for g in display.groups() if g is not None)) if display else ""
    return _tidy(rest, sentence=sentence)


def _holds_math(text: str) -> bool:
    """A digit or a math character: what GSM8K's "#### 72" holds and a Markdown "#### Heading" does not."""
    return any(c.isdigit() or c in "$\\^_={}()[]/+-*<>|" for c in text)


def _answer_like(text: str) -> bool:
    """Whether a statement reads as an answer: it holds a digit or math, or is at most two words that do not point
    elsewhere ("Monday", "no solution"; not "see above", not "consistent with the constraints")."""
    if _holds_math(text):
        return True
    words = [w.strip(".,:;!*").lower() for w in text.split()]
    return len(words) <= 2 and not _POINTERS.intersection(words)


def _phrases(text: str) -> list[_Found]:
    """The last explicit ("the final answer is", "Final answer:") and the last plain ("the answer is", "answer:")
    statement, each to the end of its sentence or line (only the last of each is read: linear time)."""
    last: dict[int, re.Match[str]] = {}
    for m in _ANSWER_PHRASE.finditer(text):
        last[EXPLICIT if m.group("final") or m.group("final2") else PLAIN] = m
    found = [_Found(tier, m.start(), _stated(text, m.end())) for tier, m in last.items()]
    return sorted((_weighed(f) for f in found if f.text), key=lambda f: f.at)


def _answer_lines(text: str) -> list[_Found]:
    """The last "Final Answer: ..." (explicit) and "Answer: ..." (plain) line; a line that itself states the final
    answer in a sentence ("Final Answer: The final answer is $x$. I hope it is correct.") gives that answer; a line
    that is only a "Final Answer" heading (explicit) gives what the next non-empty line states. A sentence there whose
    subject "is" a value gives the value ("Final Answer: The largest $n$ is 34. I hope it is correct." reads 34)."""
    last: dict[int, re.Match[str]] = {}
    for m in _ANSWER_LINE.finditer(text):
        last[EXPLICIT if _FINAL_BEFORE.search(text, max(0, m.start() - 12), m.start()) else PLAIN] = m
    found = []
    for tier, m in last.items():
        within = _phrases(m.group(1))
        found.append(_Found(tier, m.start(), within[-1].text if within else _stated(text, m.start(1), sentence=True)))
    heading = None
    for m in _FINAL_HEADING.finditer(text):
        heading = m
    if heading is not None:  # the statement starts at the next non-blank character
        start = len(text) - len(text[heading.end() :].lstrip())
        found.append(_Found(EXPLICIT, heading.start(), _stated(text, start, sentence=True)))
    return sorted((_weighed(f) for f in found if f.text), key=lambda f: f.at)


def _weighed(found: _Found) -> _Found:
    """A statement of the final answer that does not read as one ("the final answer is consistent with the
    constraints", "Final Answer: see above") is only plain: a box or another explicit answer beats it."""
    return found._replace(tier=PLAIN) if found.tier == EXPLICIT and not _answer_like(found.text) else found


def _last_match(pattern: re.Pattern[str], text: str, tier: int) -> list[_Found]:
    found = None
    for m in pattern.finditer(text):
        found = m
    value = found.group(1).strip().strip("*").strip() if found else ""
    return [_Found(tier, found.start(), value)] if found and value else []


def _answer_tag(text: str) -> list[_Found]:
    close = text.rfind("</answer>")
    start = text.rfind("<answer>", 0, close) if close >= 0 else -1
    value = text[start + len("<answer>") : close].strip() if start >= 0 else ""
    return [_Found(EXPLICIT, start, value)] if value else []


def _last_number(text: str) -> list[_Found]:
    found = None
    for m in _LAST_NUMBER.finditer(text):
        found = m
    return [_Found(FALLBACK, found.start(), found.group())] if found else []


def _checked(extractors: Iterable[str]) -> tuple[str, ...]:
    names = () if isinstance(extractors, str) else tuple(extractors)
    unknown = [name for name in names if name not in EXTRACTORS]
    if unknown or not names:
        what = f"unknown answer extractor(s) {unknown}" if unknown else f"no answer extractors in {extractors!r}"
        raise ValueError(f"{what}; valid (a non-empty tuple; the order breaks ties): {', '.join(EXTRACTORS)}")
    return names


def _find(name: str, window: str) -> list[_Found]:
    """What one extractor finds in the window (the one dispatch on extractor names)."""
    if name == "boxed":
        group = _box_group(window)
        return [group] if group else []
    if name == "answer_line":
        return _answer_lines(window)
    if name == "final_answer_phrase":
        return _phrases(window)
    if name == "hashes":
        return [f for f in _last_match(_HASHES_LINE, window, EXPLICIT) if _holds_math(f.text)]
    if name == "answer_tag":
        return _answer_tag(window)
    return _last_number(window)


def locate_answer(text: str, extractors: Iterable[str]) -> tuple[str, str] | None:
    """(the name of the extractor that found it, the answer), or None: the rule in `extract_answer`."""
    window = text[-SCAN_CHARS:]
    best: tuple[tuple[int, int, int], str, str] | None = None  # ((tier, position, -order), name, answer)
    for order, name in enumerate(_checked(extractors)):
        for found in _find(name, window):
            value = found.text
            for _ in range(3):  # `\boxed{\boxed{9}}` -> 9; a few levels, not an unbounded loop
                if value.startswith(BOX_COMMANDS) and value.endswith("}"):
                    inner = _box_group(value)
                    value = inner.text if inner else value
            key = (found.tier, found.at, -order)
            if value and (best is None or key > best[0]):
                best = (key, name, value)
    return None if best is None else (best[1], best[2])


def extract_answer(text: str, *, extractors: Iterable[str] = DEFAULT_EXTRACT) -> str | None:
    """The final answer of a completion, as `extractors` find it; None if none of them finds one.

    Each extractor finds the last statement of its kind:
    "boxed": the last complete `\\boxed{...}` or `\\fbox{...}` (an unclosed one is skipped), with the boxes just
      before it that only separators part ("\\boxed{1}, \\boxed{2} and \\boxed{3}" reads "1, 2, 3");
    "answer_line": the rest of the last line containing "Answer:" (any case); a line that states the answer in a
      sentence gives that answer ("Final Answer: The final answer is $x$. I hope it is correct." reads x);
    "final_answer_phrase": after the last "answer is" / "answer:" / "the final answer (to ...) is", to the end
      of that sentence or line, without a trailing period, `$`, `**`;
    "hashes": the rest of the last "####" line (GSM8K);
    "answer_tag": the content of the last `<answer>...</answer>`;
    "last_number": the last number in the text (a lenient fallback).
    Which one wins: a box, "####", `<answer>` and a statement of the *final* answer ("Final Answer:", "the final
    answer is") are explicit; "Answer:" and "the answer is" alone are plain. The explicit statement that comes last
    in the text wins; without one, the plain statement that comes last; `last_number` only when nothing else is
    found. At the same place the extractor listed first wins. So a box followed by "Final Answer: 6" reads 6, while
    a box followed by "this answer is right" reads the box. A found `\\boxed{x}` is unwrapped to x. Only the last
    `SCAN_CHARS` characters of `text` are searched. ValueError for an unknown name.
    """
    found = locate_answer(text, extractors)
    return None if found is None else found[1]
