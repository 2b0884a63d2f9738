"""Write docs/config.md, the configuration reference, from the typed schema (rlvr/config.py) and the recipe tree.

    python scripts/config_reference.py           # (re)write docs/config.md   (make config-reference)
    python scripts/config_reference.py --check   # exit 1 with a diff if docs/config.md is out of date

Every leaf key of rlvr.config.schema_keys() gets one table row: its type (the dataclass annotation; an enum as its
allowed values), its default (the config `rlvr train` composes with no overrides; algo.* per recipe) and its meaning:
the comment block directly above the key (or a trailing # comment on its line) in recipes/config.yaml, else in the
default option of a config group (recipe/dapo.yaml, model/tiny_arith.yaml, ...), else the trailing comment of the
dataclass field. A key with no meaning anywhere is an error naming it: add a comment above it in the recipe.
"""

from __future__ import annotations

import argparse
import difflib
import enum
import inspect
import io
import sys
import tokenize
import types
import typing
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf

from rlvr import config as schema

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipes"
OUTPUT = ROOT / "docs" / "config.md"
RECIPE_ORDER = ("grpo", "dr_grpo", "dapo", "gspo")  # the algo table's columns; recipes not named here follow, sorted
APPS = {"eval": "`rlvr eval`", "plan": "`rlvr plan`"}  # recipes/<name>.yaml: a command's tree on top of config.yaml


class MissingMeaning(ValueError):
    """A schema key that no recipe comment and no dataclass comment explains."""


# ---------------------------------------------------------------------------------------------------------- YAML files


@dataclass
class YamlFile:
    """One recipe file read line by line: its leading description, and each key's comment (dotted, with the package)."""

    path: Path
    package: str  # "" for _global_ / the primary configs, else the group ("data", "logger")
    description: list[str] = field(default_factory=list)
    comments: dict[str, str] = field(default_factory=dict)  # dotted key -> its comment lines, joined
    keys: list[str] = field(default_factory=list)  # every dotted key stated, in file order (mappings included)


def _split_comment(rest: str) -> tuple[str, str]:
    """`value  # comment` -> (value, comment); a # inside quotes is part of the value."""
    quote = ""
    for i, ch in enumerate(rest):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or rest[i - 1] in " \t"):
            return rest[:i].strip(), rest[i + 1 :].strip()
    return rest.strip(), ""


def read_yaml(path: Path, group: str = "") -> YamlFile:
    """Comments of a block-style recipe file: the comment lines directly above a key (no blank line between) plus a
    trailing comment on its line. The file's leading comment lines, up to the first blank or key line, describe the
    file, not its first key."""
    lines = path.read_text().splitlines()
    package = group
    if lines and lines[0].startswith("# @package"):
        package = "" if lines[0].split()[-1] == "_global_" else lines[0].split()[-1]
        lines = lines[1:]
    out = YamlFile(path, package)
    i = 0
    while i < len(lines) and lines[i].lstrip().startswith("#"):
        text = lines[i].lstrip()[1:].rstrip()
        out.description.append(text[1:] if text.startswith(" ") else text)  # further indentation kept: an example
        i += 1
    pending: list[str] = []
    stack: list[tuple[int, str]] = [(-1, package)] if package else []  # (indent, dotted key) of the open mappings
    for line in lines[i:]:
        text = line.strip()
        if not text:
            pending = []
            continue
        if text.startswith("#"):
            pending.append(text[1:].strip())
            continue
        if text.startswith("- "):  # a list entry (the defaults list): its comments belong to no key
            pending = []
            continue
        indent = len(line) - len(line.lstrip())
        name, sep, rest = text.partition(":")
        if not sep or not name.replace("_", "").isalnum():
            pending = []
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        key = f"{stack[-1][1]}.{name}" if stack else name
        value, trailing = _split_comment(rest)
        meaning = " ".join([*pending, trailing]).strip()
        if meaning:
            out.comments[key] = meaning
        out.keys.append(key)
        if not value:
            stack.append((indent, key))
        pending = []
    return out


def flat_values(path: Path, package: str) -> dict[str, Any]:
    """The dotted leaf keys a file states (its defaults list aside), with their values, uninterpolated."""
    data = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    assert isinstance(data, dict)
    data.pop("defaults", None)
    out: dict[str, Any] = {}

    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, dict) and node:
            for k, v in node.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            out[prefix] = node

    walk(package, data)
    return out


# ------------------------------------------------------------------------------------------------------- config groups


@dataclass
class Option:
    group: str
    name: str
    file: YamlFile
    sets: dict[str, Any]  # dotted key -> value, its parents in the same group included (their values first)
    parents: list[str]


def group_options(recipes: Path, group: str) -> dict[str, Option]:
    """The options of one config group (recipes/<group>/*.yaml), each with what it sets."""
    files = {p.stem: p for p in sorted((recipes / group).glob("*.yaml"))}

    def resolve(name: str) -> tuple[dict[str, Any], list[str]]:
        path = files[name]
        info = read_yaml(path, group)
        defaults = (OmegaConf.to_container(OmegaConf.load(path)) or {}).get("defaults", [])  # type: ignore[union-attr]
        parents = [d for d in defaults if isinstance(d, str) and d != "_self_"]
        order = defaults if "_self_" in defaults else [*defaults, "_self_"]
        sets: dict[str, Any] = {}
        for entry in order:
            if entry == "_self_":
                sets.update(flat_values(path, info.package))
            elif isinstance(entry, str):
                sets.update(resolve(entry)[0])
        return sets, parents

    out = {}
    for name, path in files.items():
        sets, parents = resolve(name)
        out[name] = Option(group, name, read_yaml(path, group), sets, parents)
    return out


def default_choices(recipes: Path) -> dict[str, str]:
    """config.yaml's defaults list: group -> the option `rlvr train` composes with no overrides."""
    defaults = OmegaConf.to_container(OmegaConf.load(recipes / "config.yaml"))["defaults"]  # type: ignore[index]
    return {k: v for d in defaults if isinstance(d, dict) for k, v in d.items() if k in schema.GROUPS}


def compose(recipes: Path, overrides: list[list[str]]) -> list[dict[str, Any]]:
    """config.yaml composed by Hydra once per override list, uninterpolated."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(recipes.resolve()), version_base=None):
        composed = [hydra_compose("config", overrides=o) for o in overrides]
    return [OmegaConf.to_container(c, resolve=False) for c in composed]  # type: ignore[misc]


def lookup(tree: dict[str, Any], key: str) -> Any:
    node: Any = tree
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(key)
        node = node[part]
    return node


# -------------------------------------------------------------------------------------------------------------- schema


def leaf_keys() -> list[str]:
    """schema_keys() without the sections and nested sections themselves."""
    keys = schema.schema_keys()
    return [k for k in keys if not any(other.startswith(k + ".") for other in keys)]


def field_types() -> dict[str, Any]:
    """Dotted leaf key -> its resolved annotation."""
    out: dict[str, Any] = {}

    def walk(prefix: str, cls: type) -> None:
        hints = typing.get_type_hints(cls)
        for f in fields(cls):
            nested = f.default_factory() if callable(f.default_factory) else None
            if is_dataclass(nested):
                walk(f"{prefix}.{f.name}", type(nested))
            else:
                out[f"{prefix}.{f.name}"] = hints[f.name]

    for f in fields(schema.Config):
        walk(f.name, typing.get_type_hints(schema.Config)[f.name])
    return out


def field_comments() -> dict[str, str]:
    """Dotted leaf key -> the trailing # comment of its dataclass field in rlvr/config.py."""
    by_class: dict[type, dict[str, str]] = {}

    def comments(cls: type) -> dict[str, str]:
        if cls not in by_class:
            found: dict[str, str] = {}
            names: dict[int, str] = {}
            for tok in tokenize.generate_tokens(io.StringIO(inspect.getsource(cls)).readline):
                if tok.type == tokenize.NAME and tok.start[1] == 4 and tok.start[0] not in names:
                    names[tok.start[0]] = tok.string  # a field's name starts its line, indented once
                elif tok.type == tokenize.COMMENT and tok.start[0] in names:
                    found[names[tok.start[0]]] = tok.string.lstrip("#").strip()
            by_class[cls] = found
        return by_class[cls]

    out: dict[str, str] = {}

    def walk(prefix: str, cls: type) -> None:
        for f in fields(cls):
            nested = f.default_factory() if callable(f.default_factory) else None
            if is_dataclass(nested):
                walk(f"{prefix}.{f.name}", type(nested))
            elif f.name in comments(cls):
                out[f"{prefix}.{f.name}"] = comments(cls)[f.name]

    for f in fields(schema.Config):
        walk(f.name, typing.get_type_hints(schema.Config)[f.name])
    return out


def type_text(tp: Any) -> str:
    """An annotation as the reference shows it: enums as their values, None as null."""
    if tp is Any:
        return "any"
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return " | ".join(m.value for m in tp)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        parts = [type_text(a) for a in args if a is not type(None)]
        return " | ".join(parts + (["null"] if type(None) in args else []))
    if origin in (list, dict):
        return f"{origin.__name__}[{', '.join(type_text(a) for a in args)}]"
    if is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        return "{" + ", ".join(f"{f.name}: {type_text(hints[f.name])}" for f in fields(tp)) + "}"
    return getattr(tp, "__name__", str(tp))


# ------------------------------------------------------------------------------------------------------------ Markdown


def value_text(value: Any) -> str:
    """A value as YAML writes it, in one line."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return value if value else '""'
    return yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()


def cell(text: str) -> str:
    """Table-cell text: pipes escaped, `<` escaped (GitHub would take <answer> for an HTML tag)."""
    return text.replace("|", "\\|").replace("<", "&lt;")


def code(text: str) -> str:
    return f"`{text}`".replace("|", "\\|")


def row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [row(header), row(["---"] * len(header)), *(row(r) for r in rows)]


def generate(recipes: Path = RECIPES) -> str:
    """The Markdown text of docs/config.md; MissingMeaning names a schema key that nothing explains."""
    choices = default_choices(recipes)
    groups = {g: group_options(recipes, g) for g in schema.GROUPS}
    recipe_names = sorted(groups["recipe"], key=lambda n: (RECIPE_ORDER.index(n) if n in RECIPE_ORDER else 99, n))
    composed = compose(recipes, [[]] + [[f"recipe={n}"] for n in recipe_names])
    default_cfg, per_recipe = composed[0], dict(zip(recipe_names, composed[1:]))

    root = read_yaml(recipes / "config.yaml")
    sources = [root] + [groups[g][choices[g]].file for g in schema.GROUPS if g in choices]
    from_fields = field_comments()
    types_of = field_types()
    set_by_default = {k: f"{g}={c}" for g, c in choices.items() for k in groups[g][c].sets}  # key -> option

    def meaning(key: str) -> str:
        for source in sources:
            if source.comments.get(key):
                return source.comments[key]
        if from_fields.get(key):
            return from_fields[key]
        where = (
            f"recipes/recipe/{choices['recipe']}.yaml (and the other recipes)"
            if key.startswith("algo.")
            else "recipes/config.yaml"
        )
        raise MissingMeaning(
            f"config key '{key}' has no meaning: add a comment line directly above it in {where} "
            "(or a trailing # comment on its field in rlvr/config.py), then run `make config-reference`"
        )

    def default(tree: dict[str, Any], key: str) -> Any:
        try:
            return lookup(tree, key)
        except KeyError:
            raise MissingMeaning(f"config key '{key}' has no value in the composed default config") from None

    def meaning_cell(key: str) -> str:
        """The meaning, then the values the other options of the groups give the key."""
        text = meaning(key)
        others = [
            f"{code(f'{g}={name}')}: {code(value_text(opt.sets[key]))}"
            for g in schema.GROUPS
            if g != "recipe"
            for name, opt in groups[g].items()
            if key in opt.sets and f"{g}={name}" != set_by_default.get(key)
        ]
        if others:
            text = f"{text if text.endswith('.') else text + '.'} Set by {', '.join(others)}."
        return cell(text)

    out = [
        "<!-- Generated by scripts/config_reference.py from rlvr/config.py and recipes/: do not edit; run"
        " `make config-reference`. -->",
        "",
        "# Configuration reference",
        "",
        "Every key of the typed schema (`rlvr/config.py`), as `rlvr train` composes it from the recipe tree",
        f"(`recipes/config.yaml` with {', '.join(code(f'{g}={c}') for g, c in choices.items())}). Set any key on the",
        "command line (`rlvr train trainer.lr=1e-4`) or pick a group option (`rlvr train recipe=grpo data=gym`).",
        "",
        "- **type**: the schema's annotation; `a | b` lists the allowed values, `null` means the key may be null, `any`",
        "  keys take `auto` or the values their meaning lists.",
        "- **default**: the composed default config (interpolations such as `${hydra:runtime.output_dir}` as written);",
        "  a group option named beside it sets that value.",
        "- **meaning**: the comment above the key in the recipe file that sets it, else its field's comment in",
        "  `rlvr/config.py`.",
        "",
    ]
    for section in (f.name for f in fields(schema.Config)):
        keys = [k for k in leaf_keys() if k.split(".")[0] == section]
        out += [f"## `{section}`", ""]
        if section == "algo":  # one default per recipe
            columns = [f"{n} (default)" if n == choices.get("recipe") else n for n in recipe_names]
            rows = [
                [code(k), code(type_text(types_of[k])),
                 *(code(value_text(default(per_recipe[n], k))) for n in recipe_names), meaning_cell(k)]
                for k in keys
            ]  # fmt: skip
            out += ["One column per recipe (`recipe=<name>`, `recipes/recipe/<name>.yaml`); each recipe states every "
                    "`algo` key.", ""]  # fmt: skip
            out += [*table(["key", "type", *columns, "meaning"], rows), "", *option_notes(groups["recipe"])]
        else:
            rows = []
            for k in keys:
                value = code(value_text(default(default_cfg, k)))
                if k in set_by_default:
                    value += f" ({code(set_by_default[k])})"
                rows.append([code(k), code(type_text(types_of[k])), value, meaning_cell(k)])
            out += table(["key", "type", "default", "meaning"], rows)
            if section in groups:
                out += ["", *option_notes(groups[section])]
        out.append("")
    for app, title in APPS.items():
        out += app_section(recipes, app, title)
    return "\n".join(out).rstrip("\n") + "\n"


def option_notes(options: dict[str, Option]) -> list[str]:
    """A list of a group's options: each one's description (less the lines all of them share) and the keys it sets
    (a recipe: those beside its algo column)."""
    shared = set.intersection(*(set(o.file.description) for o in options.values())) if len(options) > 1 else set()
    group = next(iter(options.values())).group
    out = [f"Options of the `{group}` group (`{group}=<name>`, `recipes/{group}/<name>.yaml`):", ""]
    for name, opt in options.items():
        text = " ".join(line for line in opt.file.description if line not in shared)
        based = f" On top of {', '.join(code(f'{group}={p}') for p in opt.parents)}." if opt.parents else ""
        sets = {k: v for k, v in opt.sets.items() if not (group == "recipe" and k.startswith("algo."))}
        listed = f" Sets {', '.join(code(f'{k}={value_text(v)}') for k, v in sets.items())}." if sets else ""
        out.append(f"- {code(f'{group}={name}')}: {cell(text)}{based}{listed}".rstrip())
    return out


def app_section(recipes: Path, app: str, title: str) -> list[str]:
    """A command's own keys (recipes/<app>.yaml beside config.yaml) and the schema keys it sets differently."""
    info = read_yaml(recipes / f"{app}.yaml")
    values = flat_values(recipes / f"{app}.yaml", "")
    sections = {f.name for f in fields(schema.Config)} | {"hydra"}
    own = [k for k in values if k.split(".")[0] not in sections]
    overrides = [k for k in values if k.split(".")[0] in sections - {"hydra"}]
    rows = []
    for k in own:
        if not info.comments.get(k):
            raise MissingMeaning(f"{app} key '{k}' has no meaning: add a comment line directly above it in "
                                 f"recipes/{app}.yaml")  # fmt: skip
        rows.append([code(k), code(value_text(values[k])), cell(info.comments[k])])
    prose = [line for line in info.description if not line.startswith(" ")]
    examples = [line.strip() for line in info.description if line.startswith(" ")]
    out = [f"## {title}", "", cell(" ".join(prose)), ""]
    if examples:
        out += ["```", *examples, "```", ""]
    out += [f"`recipes/{app}.yaml`: the training tree above plus these keys of its own.", ""]
    out += table(["key", "default", "meaning"], rows)
    if overrides:
        out += ["", "It also sets these training keys differently:", ""]
        for k in overrides:
            out.append(f"- {code(f'{k}={value_text(values[k])}')}: {cell(info.comments.get(k, ''))}".rstrip(" :"))
    return [*out, ""]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 with a diff if docs/config.md is out of date")
    args = parser.parse_args(argv)
    try:
        text = generate()
    except MissingMeaning as e:
        print(f"config_reference: {e}", file=sys.stderr)
        return 2
    current = OUTPUT.read_text() if OUTPUT.exists() else ""
    if args.check:
        if current == text:
            return 0
        diff = difflib.unified_diff(current.splitlines(True), text.splitlines(True), "docs/config.md", "generated")
        sys.stdout.writelines(diff)
        print("docs/config.md is out of date: run `make config-reference`", file=sys.stderr)
        return 1
    if current != text:
        OUTPUT.write_text(text)
        print(f"wrote {OUTPUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
