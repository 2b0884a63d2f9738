"""Examples for training and evaluation: the tasks' examples, the prompt budget, and a seeded, resumable stream.

A file task reads the user's dataset (.jsonl/.json/.parquet/.csv, or a hub dataset id) and checks every row before
any model loads: a bad row is a ConfigError naming the file, the row (the line, for JSON Lines) and the field.
The stream walks the training examples in a fresh seeded permutation per epoch; its position (epoch, index) is all
the state it has, so a checkpoint can restore it exactly.
"""

from __future__ import annotations

import csv
import json
import math
import random
import re
from pathlib import Path
from typing import Any

from rlvr.config import AnswerExtract, ConfigError, DataConfig, Task, VerifierName
from rlvr.tasks import arithmetic
from rlvr.types import Example

SUPPORTED = (".jsonl", ".json", ".parquet", ".csv")
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")  # "name" or "org/name"

Rows = list[tuple[int, dict[str, Any] | str]]  # (1-based row or line number, the row, or why it could not be parsed)


def load_task(cfg: DataConfig) -> tuple[list[Example], list[Example], VerifierName]:
    """(training examples, held-out evaluation examples, the task's verifier) of the configured task."""
    if cfg.task is Task.arithmetic:
        return arithmetic.train_examples(), arithmetic.eval_examples(cfg.eval_size), VerifierName.arithmetic
    if cfg.task is Task.gym:
        from rlvr.tasks import gym  # imports reasoning-gym: only gym tasks need it

        assert cfg.name, "config.check requires data.name when data.task=gym"
        train, held_out = gym.examples(cfg.name, size=cfg.size, eval_size=cfg.eval_size, seed=cfg.seed, options=cfg.options)
        return train, held_out, VerifierName.gym
    if cfg.task is Task.code:
        from rlvr.tasks import code  # its own module: the record forms, HumanEval, rlvr's functions

        if cfg.name == "humaneval":
            problems = code.humaneval_examples()
            cut = max(len(problems) - cfg.eval_size, 0)  # all 164 held out is `rlvr eval`'s use
            return problems[:cut], problems[cut:], VerifierName.code
        return (*code.functions_examples(cfg.size, cfg.eval_size, cfg.seed), VerifierName.code)
    if cfg.task is Task.calc:
        from rlvr.tasks import calc

        return (*calc.examples(size=cfg.size, eval_size=cfg.eval_size, seed=cfg.seed, options=cfg.options), VerifierName.math)
    if cfg.task is Task.env:  # prompts for an environment without a dataset: each one episode of data.env_id
        return env_examples(cfg.env_id, cfg.size, 0), env_examples(cfg.env_id, cfg.eval_size, cfg.size), VerifierName.none
    if cfg.task is Task.file:
        assert cfg.path, "config.check requires data.path when data.task=file"
        examples = read_examples(cfg.path, "data.path", cfg)
        verifier = VerifierName.math if cfg.tests_key is None else VerifierName.code
        if cfg.eval_path:
            held_out = read_examples(cfg.eval_path, "data.eval_path", cfg)
            return examples, held_out[: cfg.eval_size], verifier
        if cfg.eval_size >= len(examples):
            raise ConfigError(
                f"data.eval_size ({cfg.eval_size}) leaves no training rows: {cfg.path} has {len(examples)} rows "
                f"and the last data.eval_size are held out for evaluation; lower data.eval_size or set data.eval_path"
            )
        return examples[: -cfg.eval_size], examples[-cfg.eval_size :], verifier
    raise AssertionError(f"unhandled task {cfg.task}")


def env_examples(env_id: str | None, size: int, start: int) -> list[Example]:
    """`size` prompts for an environment (data=env), numbered from `start` (held-out ones after the training ones):
    each names data.env_id as its prompt (the environment's first observation takes its place) and carries it, and its
    number, to the environment's factory (`env_id`, `index`)."""
    name = env_id or "env"
    return [Example(f"{name}:{i}", name, "", extra=(("env_id", env_id), ("index", i))) for i in range(start, start + size)]


def read_examples(path: str, key: str, cfg: DataConfig) -> list[Example]:
    """Every row of a dataset file (or hub dataset) as an Example; `key` is the config key that named it.

    The prompt field holds a string or a list of chat messages; the answer field a string or a number, reduced to
    its final answer by data.answer_extract (a GSM8K "#### 72" or a MATH \\boxed{...} solution). With data.tests_key
    the row's tests (and the columns that go with them) become the code verifier's test record instead.
    """
    prompt_key, answer_key = cfg.prompt_key, cfg.tests_key or cfg.answer_key
    unit, rows = _read_rows(path, key, (prompt_key, answer_key), cfg.split, cfg.subset, every_column=bool(cfg.tests_key))
    if not rows:
        raise ConfigError(f"{key}: {path} has no rows")
    name = Path(path).name if Path(path).expanduser().exists() else path  # a hub id names itself
    examples, first_problem, bad = [], "", 0
    for n, row in rows:
        problem = row if isinstance(row, str) else _row_problem(row, prompt_key, answer_key, code=bool(cfg.tests_key))
        answer = gold = None
        if not problem and cfg.tests_key:
            assert isinstance(row, dict)
            answer, gold, problem = _tests(row, cfg.tests_key)
        elif not problem:
            assert isinstance(row, dict)
            answer = final_answer(row[answer_key], cfg.answer_extract)
            if answer is None:
                problem = (f"field '{answer_key}' (data.answer_key) has no final answer to extract with "
                           f"data.answer_extract={cfg.answer_extract.value}: {_show(row[answer_key])}")  # fmt: skip
        if problem:
            first_problem, bad = first_problem or f"{unit} {n}: {problem}", bad + 1
            continue
        assert isinstance(row, dict) and answer is not None
        prompt = row[prompt_key]
        if isinstance(prompt, str):
            examples.append(Example(f"{name}:{n}", prompt, answer, gold=gold))
        else:
            messages = tuple({"role": m["role"], "content": m["content"]} for m in prompt)
            last_user = next(m["content"] for m in reversed(messages) if m["role"] == "user")
            examples.append(Example(f"{name}:{n}", last_user, answer, messages=messages, gold=gold))
    if bad:
        raise ConfigError(f"{key}: {path} {first_problem} ({bad} of {len(rows)} {unit}s have problems)")
    return examples


def _tests(row: dict[str, Any], tests_key: str) -> tuple[str | None, str | None, str | None]:
    """(the row's test record as the code verifier's answer, its short text for people, None), or (None, None, why it
    cannot be read)."""
    from rlvr.tasks import code

    try:
        record = code.record_from_row(row, tests_key)
    except ValueError as e:
        return None, None, f"{e} (data.tests_key)"
    return code.encode(record), code.describe(record), None


def final_answer(value: str | int | float, mode: AnswerExtract) -> str | None:
    """The gold answer a verifier compares with: the value itself, or the final answer inside a full solution."""
    text = value if isinstance(value, str) else str(value)
    if mode is AnswerExtract.none:
        return text
    if mode is AnswerExtract.hashes:
        found = text.rpartition("####")[2].strip() if "####" in text else ""
        return found.replace(",", "") or None  # GSM8K writes "#### 1,000"
    from rlvr.verifiers.extraction import extract_answer

    return extract_answer(text, extractors=("boxed",))


def _row_problem(row: dict[str, Any], prompt_key: str, answer_key: str, code: bool = False) -> str | None:
    """Why one row cannot be an Example, or None if it can (`code`: answer_key is data.tests_key, read elsewhere)."""
    answer_option = "data.tests_key" if code else "data.answer_key"
    for field, option in ((prompt_key, "data.prompt_key"), (answer_key, answer_option)):
        if field not in row:
            return f"no field '{field}' ({option}); the row has: {', '.join(map(str, row)) or 'no fields'}"
    prompt, answer = row[prompt_key], row[answer_key]
    if isinstance(prompt, list):
        return _messages_problem(prompt, prompt_key)
    if not isinstance(prompt, str) or not prompt.strip():
        return f"field '{prompt_key}' (data.prompt_key) must be a non-empty string or a list of chat messages, got {_show(prompt)}"
    if code:
        return None
    nan = isinstance(answer, float) and math.isnan(answer)  # a null in a pandas-written float column
    if answer is None or nan or (isinstance(answer, str) and not answer.strip()):
        return f"field '{answer_key}' (data.answer_key) is empty: got {_show(answer)}"
    if isinstance(answer, bool) or not isinstance(answer, str | int | float):
        return f"field '{answer_key}' (data.answer_key) must be a string or a number, got {_show(answer)}"
    return None


def _messages_problem(messages: list[Any], prompt_key: str) -> str | None:
    """Why a chat `messages` list is not one, or None: objects with a role and a string content, a user message. A
    `tool` message (a function's result, as in a few-shot example of tool use) is rendered by the chat template."""
    where = f"field '{prompt_key}' (data.prompt_key)"
    if not messages:
        return f"{where} is an empty list of messages"
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not {"role", "content"} <= m.keys():
            return f"{where}: message {i} must be an object with 'role' and 'content', got {_show(m)}"
        if m["role"] not in ("system", "user", "assistant", "tool") or not isinstance(m["content"], str):
            return f"{where}: message {i} must have role system|user|assistant|tool and a string content, got {_show(m)}"
    if not any(m["role"] == "user" for m in messages):
        return f"{where} has no user message"
    return None


def _show(value: Any) -> str:
    """A value's type and a short repr, for error messages."""
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def _read_rows(path: str, key: str, columns: tuple[str, str], split: str, subset: str | None,
               every_column: bool = False) -> tuple[str, Rows]:  # fmt: skip
    """("line" | "row", the raw rows) of a local file by its extension, or of a hub dataset id (`every_column`: keep
    the columns besides `columns`, which a code dataset's tests read)."""
    file = Path(path).expanduser()
    suffix = file.suffix.lower()
    if not file.exists() and HUB_ID.fullmatch(path) and suffix not in SUPPORTED:
        return "row", _read_table(path, key, columns, "hub", split, subset, every_column)
    try:
        with file.open("rb") as f:
            data = f.read() if suffix in (".jsonl", ".json") else b""  # datasets reads the others itself
    except OSError as e:
        raise ConfigError(f"{key}: cannot read {path}: {e.strerror or e}") from None
    if suffix == ".jsonl":
        return "line", _jsonl_rows(data)
    if suffix == ".json":
        return _json_rows(data, path, key)
    if suffix in (".parquet", ".csv"):
        return "row", _read_table(path, key, columns, suffix, split, subset, every_column)
    raise ConfigError(f"{key}: {path} has an unsupported extension '{file.suffix}'; supported: {', '.join(SUPPORTED)}")


def _jsonl_rows(data: bytes) -> Rows:
    """One JSON object per line; blank lines are skipped but counted, so numbers are the file's line numbers."""
    rows: Rows = []
    for n, line in enumerate(data.split(b"\n"), 1):  # not splitlines(): U+2028 may sit inside a JSON string
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            rows.append((n, f"not valid JSON: {e.msg} at column {e.colno}"))
            continue
        except ValueError as e:  # not UTF-8
            rows.append((n, f"not valid JSON: {e}"))
            continue
        rows.append((n, _object(row)))
    return rows


def _json_rows(data: bytes, path: str, key: str) -> tuple[str, Rows]:
    """A .json file: a list of objects, or (as `datasets` also reads it) one object per line."""
    try:
        doc = json.loads(data)
    except ValueError as e:
        if data.lstrip().startswith(b"["):
            where = f" at line {e.lineno} column {e.colno}" if isinstance(e, json.JSONDecodeError) else ""
            raise ConfigError(f"{key}: {path} is not valid JSON: {getattr(e, 'msg', e)}{where}") from None
        return "line", _jsonl_rows(data)  # JSON Lines in a .json file
    if isinstance(doc, list):
        return "row", [(n, _object(row)) for n, row in enumerate(doc, 1)]
    if isinstance(doc, dict) and len(data.strip().split(b"\n")) == 1:
        return "line", _jsonl_rows(data)  # a one-line JSON Lines file
    keys = f" with keys {', '.join(doc)}" if isinstance(doc, dict) else ""
    kind = f"{type(doc).__name__}{keys}"
    raise ConfigError(f"{key}: {path} must hold a list of objects or one object per line, got a {kind}")


def _object(row: Any) -> dict[str, Any] | str:
    """A parsed JSON row, or why it is not one."""
    return row if isinstance(row, dict) else f"expected a JSON object, got {_show(row)}"


def _read_table(path: str, key: str, columns: tuple[str, str], kind: str, split: str, subset: str | None,
                every_column: bool = False) -> Rows:  # fmt: skip
    """The rows of a `datasets` table (kind: ".parquet", ".csv" or "hub"), after checking it has `columns`."""
    import datasets  # slow to import; only file tasks need it
    import pyarrow.parquet

    file = str(Path(path).expanduser())
    try:
        if kind == ".parquet":
            if pyarrow.parquet.read_metadata(file).num_rows == 0:
                return []  # datasets fails on an empty file without saying so
            table = datasets.Dataset.from_parquet(file)
        elif kind == ".csv":
            with open(file, newline="", encoding="utf-8-sig", errors="replace") as f:
                reader = csv.reader(f)
                header, first_row = next(reader, []), next(reader, None)
            if first_row is None:
                return []  # datasets fails on an empty file without saying so
            as_text = datasets.Features({c: datasets.Value("string") for c in header})  # no type guessing: "007" stays
            table = datasets.Dataset.from_csv(file, features=as_text, na_filter=False)
        else:
            table = datasets.load_dataset(path, subset, split=split)
    except Exception as e:  # datasets, pandas and pyarrow raise many types: a corrupt file, offline hub, unknown id
        while e.__cause__ is not None:  # datasets wraps the parser's error in a vaguer one
            e = e.__cause__  # type: ignore[assignment]
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        if kind == "hub":
            raise ConfigError(
                f"{key}: '{path}' is not a local file, and loading it as a hub dataset (split '{split}', subset "
                f"{subset!r}) failed: "
                f"{reason}; a local file must exist and end in {', '.join(SUPPORTED)}"
            ) from None
        raise ConfigError(f"{key}: cannot read {path} as {kind.lstrip('.')}: {reason}") from None
    for field, option in zip(columns, ("data.prompt_key", "data.tests_key" if every_column else "data.answer_key")):
        if field not in table.column_names:
            its = ", ".join(table.column_names)
            raise ConfigError(f"{key}: {path} has no column '{field}' ({option}); its columns: {its}")
    return list(enumerate((table if every_column else table.select_columns(list(dict.fromkeys(columns)))).to_list(), 1))


class PromptStream:
    """Endless seeded shuffle of `examples`, one permutation per epoch.

    With skip_solved = N > 0, `record` counts each prompt's visits in a row whose samples were all correct, and `take`
    passes over a prompt with N of them (`skipped` counts those passes) unless it has already passed over a whole
    epoch's worth in this call (then every prompt is mastered, and it draws them anyway)."""

    def __init__(self, examples: list[Example], seed: int, skip_solved: int = 0) -> None:
        if not examples:
            raise ValueError("the training set is empty")
        self.examples = examples
        self.seed = seed
        self.skip_solved = skip_solved
        self.epoch = 0
        self.index = 0
        self.skipped = 0
        self.solved_streak: dict[int, int] = {}  # example index -> visits in a row with every sample correct (> 0 only)
        self._where = {id(e): i for i, e in enumerate(examples)}
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(len(self.examples)))
        random.Random(f"{self.seed}-{epoch}").shuffle(order)
        return order

    def take(self, n: int) -> list[Example]:
        out: list[Example] = []
        passed = 0
        while len(out) < n:
            if self.index == len(self._order):
                self.epoch, self.index = self.epoch + 1, 0
                self._order = self._permutation(self.epoch)
            i = self._order[self.index]
            self.index += 1
            if self._is_mastered(i) and passed < len(self.examples):
                passed += 1
                self.skipped += 1
                continue
            out.append(self.examples[i])
        return out

    def _is_mastered(self, i: int) -> bool:
        return bool(self.skip_solved) and self.solved_streak.get(i, 0) >= self.skip_solved

    def mastered(self) -> int:
        """Prompts that `take` passes over now (data.skip_solved)."""
        return sum(self._is_mastered(i) for i in self.solved_streak)

    def record(self, examples: list[Example], all_correct: list[bool]) -> None:
        """Outcomes of drawn examples' groups (data.skip_solved); nothing is kept when it is off."""
        if not self.skip_solved:
            return
        for example, solved in zip(examples, all_correct, strict=True):
            i = self._where[id(example)]
            if solved:
                self.solved_streak[i] = self.solved_streak.get(i, 0) + 1
            else:
                self.solved_streak.pop(i, None)

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "index": self.index, "skipped": self.skipped,
                "solved_streak": sorted(self.solved_streak.items())}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.index = state["epoch"], state["index"]
        self.skipped = state.get("skipped", 0)  # absent from checkpoints written before data.skip_solved
        self.solved_streak = dict(state.get("solved_streak", []))
        self._order = self._permutation(self.epoch)
