"""How environments' steps overlap in the driver's threads (rlvr.envs.run_all): 16 episodes' steps at once against
the same steps one after another, for a step that waits on a sandbox process (code_feedback on a functions task: the
public tests run) and one that computes in Python (holding the interpreter's lock), and the cost of a textarena step.

    python scripts/bench_envs.py [--episodes 16] [--repeats 5] [--smoke]

Prints a table and, last, one JSON object: per kind the medians (seconds) of the serial and the threaded runs and
their ratio. --smoke: 2 episodes, 1 repeat (tests/test_scripts.py).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time

from rlvr import envs
from rlvr.envs import code_feedback, textarena
from rlvr.tasks import code


def python_work() -> tuple:
    total = 0
    for i in range(300_000):  # ~15 ms of pure Python on these machines: the GIL is held throughout
        total += i * i % 7
    return None, float(total % 2), True, False, {}


def sandbox_steps(n: int) -> list:
    """n code_feedback environments on functions tasks, reset, each with a wrong program ready to step on."""
    out = []
    for example in code.functions_examples(n, 1, 0)[0][:n]:
        env = code_feedback.make(example.row("code"), attempts=3)
        env.reset(seed=0)
        out.append(functools.partial(env.step, "```python\ndef solve(*args):\n    return 0\n```"))
    return out


def game_steps(n: int) -> list:
    out = []
    for seed in range(n):
        env = textarena.make({"env_id": "GuessTheNumber-v0"})
        env.reset(seed=seed)
        out.append(functools.partial(env.step, "[10]"))
    return out


def timed(run) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    n, repeats = (2, 1) if args.smoke else (args.episodes, args.repeats)
    kinds = {"sandbox (code_feedback)": lambda: sandbox_steps(n), "python (holds the GIL)": lambda: [python_work] * n,
             "textarena (GuessTheNumber)": lambda: game_steps(n)}  # fmt: skip
    results = {}
    for name, build in kinds.items():
        serial, threaded = [], []
        for _ in range(repeats):
            calls = build()
            serial.append(timed(lambda calls=calls: [c() for c in calls]))
            calls = build()
            threaded.append(timed(lambda calls=calls: envs.run_all(calls, 600.0)))
        s, t = statistics.median(serial), statistics.median(threaded)
        results[name] = {"serial_s": round(s, 4), "threads_s": round(t, 4), "speedup": round(s / t, 2)}
        print(f"{name:28s} {n} steps: serial {s:.3f} s, threads {t:.3f} s, x{s / t:.2f} (median of {repeats})")
    print(json.dumps({"episodes": n, "repeats": repeats, "smoke": args.smoke, "kinds": results}))


if __name__ == "__main__":
    main()
