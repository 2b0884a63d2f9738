"""Write the two datasets of the tools learning curve (docs/measured/learning_to_act.md): the same data=calc questions
(4-digit products and sums of five 4-digit numbers), each a chat row opening with two worked examples, either calling
the calculate function (a `<tool_call>`, its result as a `tool` message, then the boxed answer) or computing in the text.

    python scripts/make_tool_shots.py OUT_DIR [--train 400] [--eval 50] [--seed 5]

Writes OUT_DIR/{tools,plain}_{train,eval}.jsonl ({"prompt": [messages], "answer": ...}); the held-out questions are
drawn from seed + 1 and none is also a training question. The untrained 135M model never writes a <tool_call> from a
description alone (0 of 450 answers, docs/measured/tools.md), so the worked examples teach the format. The last line
of stdout is one JSON object (the files, their rows). Seconds at any size (tests/test_scripts.py runs it as it is).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rlvr.tasks import calc

WORKED = (("What is 12 * 34?", "12 * 34", "408"), ("What is 250 + 175?", "250 + 175", "425"))


def shots(tools: bool) -> list[dict[str, str]]:
    """The two worked examples as chat messages: calling calculate, or computing in the text."""
    messages = []
    for question, expression, result in WORKED:
        messages.append({"role": "user", "content": question})
        if tools:
            call = "<tool_call>\n" + json.dumps({"name": "calculate", "arguments": {"expression": expression}}) + "\n</tool_call>"
            messages += [{"role": "assistant", "content": call}, {"role": "tool", "content": result},
                         {"role": "assistant", "content": f"The answer is \\boxed{{{result}}}."}]  # fmt: skip
        else:
            messages.append({"role": "assistant", "content": f"{expression} = {result}. The answer is \\boxed{{{result}}}."})
    return messages


def rows(count: int, seed: int, tools: bool, exclude: set[str] = frozenset()) -> list[dict]:  # type: ignore[assignment]
    """`count` calc questions (products and sums, 4 digits) from `seed`, none in `exclude`, each after the shots."""
    found = [(q, a) for q, a in calc.problems(count + len(exclude), seed, 4, ("product", "sum")) if q not in exclude]
    return [{"prompt": [*shots(tools), {"role": "user", "content": q}], "answer": str(a)} for q, a in found[:count]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--train", type=int, default=400)
    parser.add_argument("--eval", type=int, default=50)
    parser.add_argument("--seed", type=int, default=5)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    written = {}
    for tools in (True, False):
        held_out = rows(args.eval, args.seed + 1, tools)
        questions = {r["prompt"][-1]["content"] for r in held_out}
        for split, data in (("train", rows(args.train, args.seed, tools, questions)), ("eval", held_out)):
            path = args.out / f"{'tools' if tools else 'plain'}_{split}.jsonl"
            path.write_text("".join(json.dumps(r) + "\n" for r in data))
            written[str(path)] = len(data)
    print(json.dumps({"files": written}))


if __name__ == "__main__":
    main()
