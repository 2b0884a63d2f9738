"""Write a small math dataset in the shape users bring: one-digit sums and one-step word problems asking for \\boxed{}.

    python scripts/make_sums.py sums.jsonl [--rows 400] [--seed 0]

Each row is {"prompt": ..., "answer": ...}; train on it with `rlvr train model=smollm2_135m data=file
data.path=sums.jsonl reward.verifier=math`. The last line of stdout is one JSON object (path, rows, seed). Seconds at
any size, so it needs no smoke mode (tests/test_scripts.py runs it as it is).
"""

from __future__ import annotations

import argparse
import json
import random

WORD = [
    "Tom has {a} apples and buys {b} more. How many apples does Tom have now?",
    "A box holds {a} red balls and {b} blue balls. How many balls are in the box?",
    "Sara read {a} pages on Monday and {b} pages on Tuesday. How many pages did she read in total?",
    "There are {a} birds on a tree and {b} more land on it. How many birds are on the tree?",
]


def rows(n: int, seed: int) -> list[dict[str, str]]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        question = f"What is {a} + {b}?" if i % 2 == 0 else rng.choice(WORD).format(a=a, b=b)
        out.append({"prompt": f"{question} Put the final answer in \\boxed{{}}.", "answer": str(a + b)})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path")
    parser.add_argument("--rows", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with open(args.path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows(args.rows, args.seed))
    print(json.dumps({"path": args.path, "rows": args.rows, "seed": args.seed}))


if __name__ == "__main__":
    main()
