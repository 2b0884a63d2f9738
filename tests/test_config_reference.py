"""docs/config.md, the configuration reference, is what scripts/config_reference.py generates from the schema and the
recipes: every schema key once, with a meaning; a key nothing explains stops the generator, named."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import config_reference  # noqa: E402

from rlvr.config import Config, schema_keys  # noqa: E402

SECTIONS = [name for name in Config.__dataclass_fields__]


@pytest.fixture(scope="module")
def generated() -> str:
    return config_reference.generate()


def table_rows(text: str) -> dict[str, list[list[str]]]:
    """Per `## `section`` heading of a schema section: its table's body rows, cells split on unescaped pipes."""
    out: dict[str, list[list[str]]] = {}
    section = None
    for line in text.splitlines():
        heading = re.fullmatch(r"## `(\w+)`", line)
        if heading or line.startswith("## "):
            section = heading.group(1) if heading and heading.group(1) in SECTIONS else None
            continue
        if section and line.startswith("| ") and not line.startswith(("| key ", "| ---")):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            out.setdefault(section, []).append(cells)
    return out


def test_docs_match_the_generator(generated: str) -> None:
    current = (REPO / "docs" / "config.md").read_text()
    assert current == generated, "docs/config.md is out of date: run `make config-reference`"


def test_every_schema_key_once_with_a_meaning(generated: str) -> None:
    leaves = [k for k in schema_keys() if not any(other.startswith(k + ".") for other in schema_keys())]
    rows = table_rows(generated)
    assert sorted(rows) == sorted(SECTIONS)
    listed = [cells[0].strip("`") for section_rows in rows.values() for cells in section_rows]
    assert len(listed) == len(set(listed)), f"keys listed twice: {sorted({k for k in listed if listed.count(k) > 1})}"
    missing, extra = sorted(set(leaves) - set(listed)), sorted(set(listed) - set(leaves))
    assert not missing and not extra, f"keys of the schema missing from the reference: {missing}; not in it: {extra}"
    for section, section_rows in rows.items():
        for cells in section_rows:
            assert cells[0].strip("`").split(".")[0] == section, cells[0]
            assert all(c.strip("` ") for c in cells), f"a blank cell in the row of {cells[0]}: {cells}"
    assert "logger.verbose" in listed and "model.lora.sync" in listed


def test_a_key_without_a_comment_is_named(tmp_path: Path) -> None:
    """trainer.lr's meaning is its comment in config.yaml alone (its dataclass field has no comment): without it the
    generator stops, naming the key, instead of leaving a blank."""
    recipes = tmp_path / "recipes"
    shutil.copytree(REPO / "recipes", recipes)
    text = (recipes / "config.yaml").read_text()
    comment = "  # AdamW learning rate (constant after warmup)\n  lr: "
    assert text.count(comment) == 1
    (recipes / "config.yaml").write_text(text.replace(comment, "  lr: "))
    with pytest.raises(config_reference.MissingMeaning, match=r"'trainer\.lr'"):
        config_reference.generate(recipes)


def test_comment_parsing(tmp_path: Path) -> None:
    path = tmp_path / "x.yaml"
    path.write_text(
        "# the file's description\n"
        "top:\n"
        "  # about a\n"
        "  # (two lines)\n"
        "  a: 1\n"
        "  b: '#1'  # about b\n"
        "  # cut off by the blank line\n"
        "\n"
        "  c: 2\n"
        "  sub:\n"
        "    # about d\n"
        "    d: 3\n"
        "  e: 4\n"
    )
    info = config_reference.read_yaml(path, "grp")
    assert info.description == ["the file's description"]
    assert info.comments == {"grp.top.a": "about a (two lines)", "grp.top.b": "about b", "grp.top.sub.d": "about d"}
    assert "grp.top.c" in info.keys and "grp.top.e" in info.keys
