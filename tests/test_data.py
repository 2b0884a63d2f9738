"""The built-in task's split and verifier, dataset files (data.task=file), the prompt budget, and the prompt stream."""

from __future__ import annotations

import csv
import json
from dataclasses import fields
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import compose_config

from rlvr.config import (
    RECIPES,
    AnswerExtract,
    ConfigError,
    DataConfig,
    LongPrompts,
    PromptFormat,
    Task,
    VerifierName,
    validate,
)
from rlvr.data import PromptStream, load_task
from rlvr.prompts import drop_long_prompts
from rlvr.tasks import arithmetic
from rlvr.types import Example
from rlvr.verifiers import Outcome
from rlvr.verifiers.arithmetic import verify


def test_eval_pool_is_disjoint_from_training_pool():
    train = {e.prompt for e in arithmetic.train_examples()}
    held_out = {e.prompt for e in arithmetic.eval_examples(arithmetic.EVAL_POOL_SIZE)}
    assert len(train) == 9000 and len(held_out) == 1000
    assert not train & held_out


def test_examples_know_their_answers():
    for e in arithmetic.eval_examples(50):
        a, b = e.prompt.rstrip("=").split("+")
        assert int(e.answer) == int(a) + int(b)


def test_eval_set_is_fixed_prefix():
    assert arithmetic.eval_examples(10) == arithmetic.eval_examples(100)[:10]
    with pytest.raises(ValueError, match="eval size"):
        arithmetic.eval_examples(1001)


@pytest.mark.parametrize(
    "text, answer, outcome",
    [
        ("46", "46", Outcome.CORRECT),
        (" 46\n", "46", Outcome.CORRECT),
        ("046", "46", Outcome.CORRECT),
        ("45", "46", Outcome.INCORRECT),
        ("46+1", "46", Outcome.NO_ANSWER),
        ("", "46", Outcome.NO_ANSWER),
        ("forty-six", "46", Outcome.NO_ANSWER),
        ("9" * 100_000, "46", Outcome.NO_ANSWER),
    ],
)
def test_arithmetic_verifier(text, answer, outcome):
    assert verify(text, answer) is outcome


def test_stream_is_seeded_and_resumable():
    examples = arithmetic.train_examples()[:25]
    a = PromptStream(examples, seed=3)
    first = a.take(40)  # crosses an epoch boundary
    assert len({e.id for e in first[:25]}) == 25  # an epoch is a permutation
    state = a.state_dict()
    rest = a.take(30)
    b = PromptStream(examples, seed=3)
    b.load_state_dict(state)
    assert b.take(30) == rest
    assert PromptStream(examples, seed=4).take(25) != first[:25]


def test_skip_solved_passes_over_prompts_mastered_on_n_visits_in_a_row_and_resumes():
    examples = arithmetic.train_examples()[:10]
    stream = PromptStream(examples, seed=3, skip_solved=2)
    epoch0 = stream.take(10)
    # the first 4 of epoch 0 all correct; the next one too, but it will fail on its second visit
    stream.record(epoch0, [True] * 5 + [False] * 5)
    epoch1 = stream.take(10)  # nothing has 2 solved visits yet: the whole permutation comes back
    assert sorted(e.id for e in epoch1) == sorted(e.id for e in epoch0) and stream.skipped == 0
    stream.record(epoch1, [e in epoch0[:4] for e in epoch1])
    assert stream.mastered() == 4  # epoch0[4] failed its second visit: its count was reset
    state = stream.state_dict()
    epoch2 = stream.take(6)  # the 4 mastered prompts are passed over: the other 6 fill the next epoch
    assert {e.id for e in epoch2} == {e.id for e in epoch0[4:]}
    mastered = {examples.index(e) for e in epoch0[:4]}
    order = stream._permutation(2)  # passed over: the mastered ones before the last prompt drawn
    last = max(k for k, i in enumerate(order) if i not in mastered)
    assert stream.skipped == sum(i in mastered for i in order[:last]) > 0
    resumed = PromptStream(examples, seed=3, skip_solved=2)
    resumed.load_state_dict(state)
    assert resumed.take(6) == epoch2 and resumed.skipped == stream.skipped
    stream.record([epoch0[0]], [False])  # one failure resets a prompt's count
    assert examples.index(epoch0[0]) not in stream.solved_streak


def test_skip_solved_draws_anyway_when_every_prompt_is_mastered():
    examples = arithmetic.train_examples()[:5]
    stream = PromptStream(examples, seed=0, skip_solved=1)
    stream.record(stream.take(5), [True] * 5)
    again = stream.take(3)  # passes over one whole epoch's worth (5), then draws
    assert len(again) == 3 and stream.skipped == 5


def test_skip_solved_off_keeps_no_state():
    examples = arithmetic.train_examples()[:5]
    stream = PromptStream(examples, seed=0)
    stream.record(stream.take(5), [True] * 5)
    assert stream.solved_streak == {} and len(stream.take(5)) == 5 and stream.skipped == 0


def test_empty_training_set_is_an_error():
    with pytest.raises(ValueError, match="empty"):
        PromptStream([], seed=0)


# --- data.task=file: the user's dataset -------------------------------------------------------------------------

ROWS = [{"prompt": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(1, 6)]


def file_cfg(path, eval_path=None, eval_size=2, **kw) -> DataConfig:
    fields = dict(prompt_key="prompt", answer_key="answer", max_prompt_tokens=0, long_prompts=LongPrompts.drop,
                  format=PromptFormat.auto, system_prompt=None, prompt_template="{prompt}", subset=None,
                  answer_extract=AnswerExtract.none, name=None, size=0, seed=0, options={}, tests_key=None)
    return DataConfig(task=Task.file, path=str(path), eval_path=eval_path and str(eval_path), split="train",
                      eval_size=eval_size, **{**fields, **kw})


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def write_table(path, rows):
    """A .json/.csv/.parquet file of `rows` (dicts with the same keys)."""
    if path.suffix == ".json":
        path.write_text(json.dumps(rows))
    elif path.suffix == ".csv":
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    else:
        pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def load_error(cfg) -> str:
    with pytest.raises(ConfigError) as info:
        load_task(cfg)
    return str(info.value)


MBPP = [{"text": f"Write a function f{i} returning {i}.", "test_list": [f"assert f{i}() == {i}"],
         "test_setup_code": "import math" if i == 1 else ""} for i in range(1, 5)]  # fmt: skip


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_a_code_dataset_keeps_its_test_columns_and_is_scored_by_the_code_verifier(tmp_path, suffix):
    path = tmp_path / f"mbpp{suffix}"
    write_jsonl(path, MBPP) if suffix == ".jsonl" else write_table(path, MBPP)
    train, held_out, verifier = load_task(file_cfg(path, prompt_key="text", tests_key="test_list"))
    assert verifier is VerifierName.code and len(train) == 2 and len(held_out) == 2
    assert json.loads(train[0].answer) == {"tests": [{"assert": "assert f1() == 1"}], "setup": "import math\n"}
    assert train[0].prompt == "Write a function f1 returning 1." and train[0].gold == "1 assert on f1"


def test_a_code_row_whose_tests_cannot_be_read_is_named(tmp_path):
    path = write_jsonl(tmp_path / "mbpp.jsonl", [*MBPP[:2], {**MBPP[2], "test_list": []}, {"text": "no tests"}])
    error = load_error(file_cfg(path, prompt_key="text", tests_key="test_list"))
    assert "mbpp.jsonl line 3: column 'test_list'" in error and "(data.tests_key)" in error
    assert "(2 of 4 lines have problems)" in error


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".csv", ".parquet"])
def test_file_task_loads_prompts_answers_and_ids(tmp_path, suffix):
    path = tmp_path / f"train{suffix}"
    write_jsonl(path, ROWS) if suffix == ".jsonl" else write_table(path, ROWS)
    train, held_out, verifier = load_task(file_cfg(path))
    assert verifier is VerifierName.math
    assert train == [Example(f"train{suffix}:{n}", r["prompt"], r["answer"]) for n, r in enumerate(ROWS[:3], 1)]
    assert [e.id for e in held_out] == [f"train{suffix}:4", f"train{suffix}:5"]  # the last eval_size rows
    assert [e.answer for e in held_out] == ["8", "10"]


def test_jsonl_ids_are_line_numbers_and_numbers_become_text(tmp_path):
    lines = ['{"prompt": "a", "answer": 7}', "", '{"prompt": "b", "answer": 0.5}', '{"prompt": "c", "answer": "x"}']
    path = write_jsonl(tmp_path / "d.jsonl", lines)
    train, held_out, _ = load_task(file_cfg(path, eval_size=1))
    ids_answers = [(e.id, e.answer) for e in train + held_out]
    assert ids_answers == [("d.jsonl:1", "7"), ("d.jsonl:3", "0.5"), ("d.jsonl:4", "x")]  # line 2 is blank


def test_csv_answers_keep_their_text(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text('prompt,answer,extra\n"Say 7, padded",007,\nSay NA,NA,x\nq,1/2,y\n')
    train, _, _ = load_task(file_cfg(path, eval_size=1))
    assert [(e.prompt, e.answer) for e in train] == [("Say 7, padded", "007"), ("Say NA", "NA")]


def test_json_file_may_hold_json_lines(tmp_path):
    path = write_jsonl(tmp_path / "d.json", ROWS)
    train, _, _ = load_task(file_cfg(path))
    assert [e.id for e in train] == ["d.json:1", "d.json:2", "d.json:3"]


def test_eval_path_gives_the_first_eval_size_rows(tmp_path):
    train_path = write_jsonl(tmp_path / "train.jsonl", ROWS)
    eval_path = write_table(tmp_path / "test.parquet", [{"prompt": f"p{i}", "answer": i} for i in (1, 2, 3)])
    train, held_out, _ = load_task(file_cfg(train_path, eval_path, eval_size=2, max_prompt_tokens=8))
    assert len(train) == 5  # nothing held out of the training file
    assert held_out == [Example("test.parquet:1", "p1", "1"), Example("test.parquet:2", "p2", "2")]


def test_eval_size_must_leave_training_rows(tmp_path):
    path = write_jsonl(tmp_path / "small.jsonl", ROWS[:2])
    message = load_error(file_cfg(path, eval_size=2))
    assert "data.eval_size" in message and "small.jsonl" in message and "2 rows" in message


@pytest.mark.parametrize(
    "lines, expected",
    [
        (['{"prompt": "a", "solution": "1"}'], ["line 3", "'answer'", "data.answer_key", "prompt, solution"]),
        (['{"question": "a", "answer": "1"}'], ["line 3", "'prompt'", "data.prompt_key", "question, answer"]),
        (['{"prompt": "", "answer": "1"}'], ["line 3", "'prompt'", "non-empty string"]),
        (['{"prompt": [{"role": "user"}], "answer": "1"}'], ["line 3", "'prompt'", "message 0", "'role' and 'content'"]),
        (['{"prompt": [], "answer": "1"}'], ["line 3", "'prompt'", "empty list of messages"]),
        (['{"prompt": [{"role": "system", "content": "x"}], "answer": "1"}'], ["line 3", "no user message"]),
        (['{"prompt": [{"role": "bot", "content": "x"}], "answer": "1"}'], ["line 3", "message 0", "system|user|assistant|tool"]),
        (['{"prompt": {"text": "a"}, "answer": "1"}'], ["line 3", "'prompt'", "a list of chat messages, got dict"]),
        (['{"prompt": "a", "answer": null}'], ["line 3", "'answer'", "empty"]),
        (['{"prompt": "a", "answer": " "}'], ["line 3", "'answer'", "empty"]),
        (['{"prompt": "a", "answer": ["1", "2"]}'], ["line 3", "'answer'", "string or a number"]),
        (['{"prompt": "a", "answer": "1"'], ["line 3", "not valid JSON"]),
        (["[1, 2]"], ["line 3", "expected a JSON object"]),
    ],
)
def test_bad_jsonl_line_is_named(tmp_path, lines, expected):
    path = write_jsonl(tmp_path / "bad.jsonl", [ROWS[0], ROWS[1], *lines, ROWS[2], '{"prompt": ""}'])
    message = load_error(file_cfg(path))
    assert message.startswith(f"data.path: {path} line 3: ")
    for part in expected:
        assert part in message, (part, message)
    assert "(2 of 5 lines have problems)" in message  # the first bad row, and how many there are


@pytest.mark.parametrize("suffix", [".json", ".csv", ".parquet"])
def test_bad_table_row_is_named(tmp_path, suffix):
    rows = [*ROWS[:2], {"prompt": "c", "answer": None if suffix != ".csv" else ""}, *ROWS[2:]]
    message = load_error(file_cfg(write_table(tmp_path / f"bad{suffix}", rows)))
    assert f"bad{suffix} row 3: field 'answer' (data.answer_key) is empty" in message
    assert "(1 of 6 rows have problems)" in message


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_missing_column_lists_the_columns(tmp_path, suffix):
    path = write_table(tmp_path / f"t{suffix}", [{"problem": "a", "answer": "1"}])
    message = load_error(file_cfg(path))
    assert f"data.path: {path} has no column 'prompt' (data.prompt_key); its columns: problem, answer" == message


def test_eval_path_rows_are_checked_too(tmp_path):
    eval_path = write_jsonl(tmp_path / "test.jsonl", [ROWS[0], {"prompt": "x"}])
    message = load_error(file_cfg(write_jsonl(tmp_path / "train.jsonl", ROWS), eval_path))
    assert message.startswith(f"data.eval_path: {eval_path} line 2: no field 'answer'")


def test_unreadable_files_name_the_key_and_the_reason(tmp_path):
    missing = tmp_path / "nope.jsonl"
    assert load_error(file_cfg(missing)) == f"data.path: cannot read {missing}: No such file or directory"
    folder = tmp_path / "folder.jsonl"
    folder.mkdir()
    train = write_jsonl(tmp_path / "t.jsonl", ROWS)
    assert load_error(file_cfg(train, folder)) == f"data.eval_path: cannot read {folder}: Is a directory"
    corrupt = tmp_path / "corrupt.parquet"
    corrupt.write_text("not parquet")
    assert load_error(file_cfg(corrupt)).startswith(f"data.path: cannot read {corrupt} as parquet: ")
    ragged = tmp_path / "ragged.csv"
    ragged.write_text("prompt,answer\na,1\nb,2,3,4\n")
    assert load_error(file_cfg(ragged)) == (
        f"data.path: cannot read {ragged} as csv: Error tokenizing data. C error: Expected 2 fields in line 3, saw 4"
    )


def test_empty_file_and_unknown_extension(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert load_error(file_cfg(empty)) == f"data.path: {empty} has no rows"
    header_only = tmp_path / "empty.csv"
    header_only.write_text("prompt,answer\n")
    assert load_error(file_cfg(header_only)) == f"data.path: {header_only} has no rows"
    no_rows = write_table(tmp_path / "empty.parquet", [])
    assert load_error(file_cfg(no_rows)) == f"data.path: {no_rows} has no rows"
    tsv = tmp_path / "d.tsv"
    tsv.write_text("prompt\tanswer\n")
    message = load_error(file_cfg(tsv))
    assert "d.tsv" in message and "'.tsv'" in message and ".jsonl, .json, .parquet, .csv" in message


def test_json_must_be_a_list_of_objects(tmp_path):
    path = tmp_path / "d.json"
    path.write_text(json.dumps({"data": ROWS, "version": 1}, indent=1))
    assert "got a dict with keys data, version" in load_error(file_cfg(path))
    path.write_text('[{"prompt": "a", "answer": 1},\n oops]')
    assert load_error(file_cfg(path)).startswith(f"data.path: {path} is not valid JSON: Expecting value at line 2")


def test_hub_id_offline_is_a_config_error():
    message = load_error(file_cfg("someone/no-such-dataset-xyz"))
    assert message.startswith("data.path: 'someone/no-such-dataset-xyz' is not a local file")


# --- the prompt budget ------------------------------------------------------------------------------------------

def examples_of_lengths(lengths: list[int]) -> list[Example]:
    return [Example(f"d.jsonl:{n}", f"p{n}", "1", prompt_ids=(7,) * k) for n, k in enumerate(lengths, 1)]


EXAMPLES = examples_of_lengths([3, 9, 5, 10])


def test_drop_long_prompts_keeps_those_within_budget():
    assert drop_long_prompts(EXAMPLES, 5, LongPrompts.drop) == ([EXAMPLES[0], EXAMPLES[2]], 2)
    assert drop_long_prompts(EXAMPLES, 0, LongPrompts.error) == (EXAMPLES, 0)  # 0 = no budget
    short = examples_of_lengths([3, 4, 5, 1])
    assert drop_long_prompts(short, 5, LongPrompts.error) == (short, 0)


def test_long_prompt_error_names_the_first_one():
    with pytest.raises(ConfigError) as info:
        drop_long_prompts(EXAMPLES, 5, LongPrompts.error)
    message = str(info.value)
    assert "d.jsonl:2 has 9 tokens" in message and "data.max_prompt_tokens=5" in message and "2 of 4" in message


def test_dropping_every_prompt_is_an_error():
    with pytest.raises(ConfigError, match=r"every prompt is over data.max_prompt_tokens=2 \(the shortest has 3"):
        drop_long_prompts(EXAMPLES, 2, LongPrompts.drop)


# --- the data=file recipe ---------------------------------------------------------------------------------------


def test_file_recipe_validates_and_requires_a_path():
    cfg = validate(compose_config("data=file", "data.path=train.jsonl"))
    assert cfg.data.task is Task.file and cfg.data.path == "train.jsonl" and cfg.data.long_prompts is LongPrompts.drop
    with pytest.raises(ConfigError, match="data.path"):
        validate(compose_config("data=file"))


def test_every_data_field_is_stated_once_with_a_comment():
    """config.yaml's data block states every DataConfig field, each under a comment; a data group file overrides only
    known fields, each under a comment too."""
    root = (Path(RECIPES) / "config.yaml").read_text().split("\ndata:\n")[1].split("\n\n")[0].splitlines()
    groups = [(Path(RECIPES) / "data" / f"{name}.yaml").read_text().splitlines() for name in ("arithmetic", "file", "gym")]
    for lines, indent in [(root, "  ")] + [(g, "") for g in groups]:
        keys = [i for i, line in enumerate(lines) if line.startswith(indent) and not line.strip().startswith("#")]
        for i in keys:
            assert i > 0 and lines[i - 1].strip().startswith("#"), lines[i]
        stated = [lines[i].strip().split(":")[0] for i in keys]
        assert set(stated) <= {f.name for f in fields(DataConfig)} and len(stated) == len(set(stated))
        if indent:
            assert set(stated) == {f.name for f in fields(DataConfig)}


# --- datasets in their usual shapes: chat rows, GSM8K and MATH solutions ------------------------------------------


def test_chat_message_rows_keep_their_messages(tmp_path):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"}]
    path = write_jsonl(tmp_path / "chat.jsonl", [{"prompt": messages, "answer": 4}, *ROWS])
    train, _, _ = load_task(file_cfg(path, eval_size=1))
    assert train[0].messages == tuple(messages) and train[0].prompt == "What is 2 + 2?" and train[0].answer == "4"
    assert train[1].messages is None and train[1].prompt == ROWS[0]["prompt"]


GSM8K = [  # the shape of GSM8K's "main" rows: a worked solution ending in "#### <answer>"
    {"question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
                 "How many clips did Natalia sell altogether in April and May?",
     "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips.\n#### 72"},
    {"question": "A farm has 1,200 hens and buys 300 more. How many hens?", "answer": "1200 + 300 = 1500\n#### 1,500"},
    {"question": "q3", "answer": "x\n#### -3"},
]
MATH = [  # the shape of MATH rows: a solution with the final answer boxed
    {"problem": "What is $\\frac{1}{2} + \\frac{1}{4}$?", "solution": "We get $\\frac{2}{4} + \\frac{1}{4} = \\boxed{\\frac{3}{4}}$."},
    {"problem": "Find $x$.", "solution": "First $\\boxed{2}$ was wrong; so $x = \\boxed{\\sqrt{2}}$."},
]


def test_gsm8k_solutions_reduce_to_the_final_answer(tmp_path):
    path = write_jsonl(tmp_path / "gsm8k.jsonl", GSM8K)
    train, held_out, _ = load_task(file_cfg(path, eval_size=1, prompt_key="question", answer_extract=AnswerExtract.hashes))
    assert [e.answer for e in train + held_out] == ["72", "1500", "-3"]
    assert train[0].prompt.startswith("Natalia sold clips")


def test_math_solutions_reduce_to_the_last_boxed_answer(tmp_path):
    path = write_jsonl(tmp_path / "math.jsonl", MATH)
    train, held_out, _ = load_task(file_cfg(path, eval_size=1, prompt_key="problem", answer_key="solution",
                                            answer_extract=AnswerExtract.boxed))  # fmt: skip
    assert [e.answer for e in train + held_out] == ["\\frac{3}{4}", "\\sqrt{2}"]


def test_a_solution_without_a_final_answer_is_named(tmp_path):
    path = write_jsonl(tmp_path / "gsm8k.jsonl", [*GSM8K, {"question": "q", "answer": "no hashes here"}])
    message = load_error(file_cfg(path, eval_size=1, prompt_key="question", answer_extract=AnswerExtract.hashes))
    assert "line 4" in message and "data.answer_extract=hashes" in message and "no final answer" in message


def test_hub_subset_is_named_when_loading_fails():
    message = load_error(file_cfg("someone/no-such-dataset-xyz", subset="main"))
    assert "subset 'main'" in message
