"""The documentation's links: every relative link in README.md and docs/**/*.md resolves to a file in the repository,
every #anchor into a Markdown file names one of its headings (GitHub's slugs), every http(s) link is well-formed
(not fetched: the tests run offline), every guide and measured page is linked from the README, and the README stays a
ten-minute read. Standard library only; the whole file runs in well under a second."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
README_MAX_WORDS = 2600
PAGES = [README, *sorted((REPO / "docs").rglob("*.md"))]

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")
ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
# a code span: a run of backticks, then anything up to the same run, within one paragraph
CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)((?:(?!\n[ \t]*\n).)+?)(?<!`)\1(?!`)", re.S)
# [text](dest "title") and ![alt](dest); the text may hold one level of brackets and span lines
LINK = re.compile(
    r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(\s*(<[^>\n]*>|[^\s()]*(?:\([^\s()]*\)[^\s()]*)*)"
    r"(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?\s*\)"
)
HTML_ANCHOR = re.compile(r"<a\s[^>]*\b(?:name|id)=[\"']([^\"']+)[\"']", re.I)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else str(path)


def prose(text: str) -> str:
    """The text with fenced code blocks and code spans blanked (newlines kept, so offsets still give line numbers)."""
    out: list[str] = []
    fence: str | None = None
    for line in text.split("\n"):
        m = FENCE.match(line)
        if fence is None and m and not (m.group(1)[0] == "`" and "`" in m.group(2)):
            fence = m.group(1)
            out.append("")
        elif fence is not None:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not m.group(2).strip():
                fence = None
            out.append("")
        else:
            out.append(line)
    return CODE_SPAN.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), "\n".join(out))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text (links' text, no emphasis or code marks), lowercased, every
    character but letters, digits, underscores, hyphens and spaces dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text)
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor a page offers: its headings' slugs (a repeated slug gets -1, -2, ...) and HTML name/id anchors."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    lines = prose(text).split("\n")
    for i, line in enumerate(lines):
        m = ATX.match(line)
        if m:
            title = m.group(2) or ""
        elif i > 0 and SETEXT.match(line) and lines[i - 1].strip() and not ATX.match(lines[i - 1]):
            title = lines[i - 1]
        else:
            continue
        base = slug(title)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    out.update(HTML_ANCHOR.findall(text))
    return out


def links(text: str) -> list[tuple[int, str]]:
    """(line number, destination) of every inline link and image outside code."""
    body = prose(text)
    found = []
    for m in LINK.finditer(body):
        dest = m.group(2)[1:-1] if m.group(2).startswith("<") else m.group(2)
        found.append((body.count("\n", 0, m.start()) + 1, dest))
    return found


def problems(page: Path, root: Path = REPO) -> list[str]:
    """What is wrong with one page's links: dead files, missing anchors, malformed or unexpected URLs."""
    text = page.read_text(encoding="utf-8")
    out = []
    for line, dest in links(text):
        where = f"{rel(page)}:{line}: ({dest})"
        if not dest:
            out.append(f"{where} an empty link")
            continue
        if SCHEME.match(dest):
            url = urlsplit(dest)
            if url.scheme == "mailto":
                continue
            if url.scheme not in ("http", "https"):
                out.append(f"{where} a link with scheme {url.scheme!r}: only relative paths and http(s) URLs")
            elif (
                not re.fullmatch(r"[A-Za-z0-9.-]+(:\d+)?", url.netloc) or "." not in (url.hostname or "") or " " in dest
            ):
                out.append(f"{where} a malformed URL")
            continue
        path, _, anchor = dest.partition("#")
        target = page if not path else (page.parent / unquote(path)).resolve()
        if not target.is_relative_to(root.resolve()):
            out.append(f"{where} points outside the repository")
        elif not target.exists():
            out.append(f"{where} no such file: {rel(target)}")
        elif anchor and target.suffix == ".md" and unquote(anchor) not in anchors(target.read_text(encoding="utf-8")):
            out.append(f"{where} {rel(target)} has no heading with the anchor #{anchor}")
    return out


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_links_resolve(page: Path) -> None:
    assert problems(page) == []


def test_guide_and_measured_pages_are_linked_from_the_readme() -> None:
    linked = {
        (README.parent / dest.partition("#")[0]).resolve()
        for _, dest in links(README.read_text())
        if not SCHEME.match(dest)
    }
    pages = sorted((REPO / "docs" / "guide").glob("*.md")) + sorted((REPO / "docs" / "measured").glob("*.md"))
    assert len(pages) > 10
    assert [rel(p) for p in pages if p.resolve() not in linked] == []


def test_guide_pages_start_with_a_title_and_a_summary() -> None:
    for page in sorted((REPO / "docs" / "guide").glob("*.md")):
        lines = page.read_text().split("\n")
        assert lines[0].startswith("# ") and lines[1] == "" and lines[2].strip(), rel(page)


def test_readme_is_a_ten_minute_read() -> None:
    words = len(README.read_text().split())  # as `wc -w` counts
    assert words < README_MAX_WORDS, f"README.md has {words} words; move reference material into docs/guide/"


# The checker itself, on pages written here.


def test_slugs_follow_github() -> None:
    assert slug("`rlvr plan`: does it fit?") == "rlvr-plan-does-it-fit"
    assert slug("Time to 0.90") == "time-to-090"
    assert slug("The math (the contract of rlvr.algo)") == "the-math-the-contract-of-rlvralgo"
    assert slug("Datasets: `data=file`") == "datasets-datafile"
    assert slug("Speed (`scripts/bench_code.py`)") == "speed-scriptsbench_codepy"
    assert slug("See [the guide](x.md) — now") == "see-the-guide--now"
    assert anchors("# A\n\n## A\n\nB\n---\n\n```\n# not a heading\n```\n") == {"a", "a-1", "b"}


def test_a_broken_link_fails(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "other.md").write_text("# Other\n\n## Part two\n")
    page = tmp_path / "README.md"
    page.write_text(
        "# Title\n\n[ok](docs/other.md#part-two) [ok](#title) [ok](docs/) ![ok](docs/other.md)\n"
        "`[in code](missing.md)`\n\n```\n[in a block](missing.md)\n```\n"
        "[dead](docs/gone.md) [no anchor](docs/other.md#part-three)\n[spans\nlines](#nowhere)\n"
        "[ok](https://example.com/a?b=c#d) [bad](https:/example.com) [bad](http://) [outside](../x.md)\n"
    )
    found = [p.split(f"{page}:")[1] for p in problems(page, root=tmp_path)]
    assert [f.split(" ")[0] for f in found] == ["9:", "9:", "10:", "12:", "12:", "12:"], found
    assert [f.split(" ")[1] for f in found] == [
        "(docs/gone.md)",
        "(docs/other.md#part-three)",
        "(#nowhere)",
        "(https:/example.com)",
        "(http://)",
        "(../x.md)",
    ], found
