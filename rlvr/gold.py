"""The gold self-check, before any model loads: every gold answer of the training and held-out sets (a seeded
`MAX_ROWS` of them when there are more) is scored by the run's verifier as if it were a perfect completion, in this
process, and must come back CORRECT. A dataset whose gold the verifier misreads would otherwise train on wrong
rewards without a sign ("reward stays 0"): below reward.gold_check the run stops with a ConfigError that names the
share, a few failing rows and the keys that usually fix it.

Each verifier's `check_gold(answer) -> Outcome | None` writes the perfect completion in its own fixed form (the gold itself
for arithmetic, `\\boxed{gold}` for math, the entry's answer in <answer> tags for gym; countdown only reads the puzzle);
None means the row has no gold to check (a reasoning-gym entry whose scorer checks a solution): it is left out of the
share, and a set with no gold at all is not checked.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlvr.config import ConfigError
from rlvr.verifiers import Outcome

if TYPE_CHECKING:  # rlvr.types imports torch; `rlvr eval` imports this module before its config is valid
    from rlvr.types import Example

MAX_ROWS = 10_000  # golds checked at most: a seeded sample of a larger set (a few seconds for the verifiers here)
SHOWN = 3  # failing rows the error names
FIXES = ("data.answer_key (the field that holds the answer), data.answer_extract (how a full solution is reduced to its "
         "final answer: none | hashes | boxed) and reward.verifier (the verifier for this data)")  # fmt: skip


@dataclass(frozen=True)
class GoldCheck:
    """What the check saw: rows checked (those with a gold to check), those CORRECT, each failure as (example id, gold as the verifier got it, the
    outcome or the error), and the time it took."""

    checked: int
    correct: int
    failures: tuple[tuple[str, str, str], ...]
    seconds: float
    sampled: bool  # the rows were a seeded sample of a larger set
    without_gold: int = 0  # rows whose check said there is no gold to check (None), left out of `checked`

    @property
    def share(self) -> float:
        return self.correct / self.checked if self.checked else 1.0

    @property
    def percent(self) -> str:
        """The share to 0.1%, rounded down: 999 of 1,000 reads 99.9%, 9,999 of 10,000 never 100.0%."""
        return f"{self.correct * 1000 // self.checked / 10:.1f}%" if self.checked else "100.0%"


def sample(examples: Sequence[Example], seed: int, cap: int = MAX_ROWS) -> list[Example]:
    """All of `examples` when there are at most `cap`, else `cap` of them drawn by `seed` (in their original order)."""
    if len(examples) <= cap:
        return list(examples)
    picked = random.Random(f"gold-{seed}").sample(range(len(examples)), cap)
    return [examples[i] for i in sorted(picked)]


def check(examples: Sequence[Example], check_gold: Callable[[str], Outcome | None], seed: int, *, cap: int = MAX_ROWS,
          threads: int = 1) -> GoldCheck:  # fmt: skip
    """Score each (sampled: at most `cap`) example's gold with `check_gold`, in `threads` threads (a verifier that waits
    on a sandbox process); a call that raises is a failure of that row."""
    start = time.perf_counter()
    rows = sample(examples, seed, cap)
    failures, without_gold = [], 0
    with ThreadPoolExecutor(max(threads, 1)) as pool:
        outcomes = list(pool.map(lambda example: _checked(check_gold, example.answer), rows))
    for example, (outcome, verdict) in zip(rows, outcomes):
        if verdict is None:  # no gold to check in this row (an outcome always comes with its words)
            without_gold += 1
            continue
        if outcome is not Outcome.CORRECT:
            failures.append((example.id, example.shown_answer, verdict))
    checked = len(rows) - without_gold
    return GoldCheck(checked, checked - len(failures), tuple(failures), time.perf_counter() - start,
                     len(rows) < len(examples), without_gold)  # fmt: skip


def _checked(check_gold: Callable[[str], Outcome | None], answer: str) -> tuple[Outcome | None, str | None]:
    """(the outcome, its words); (None, None) when the row has no gold to check; (None, the error) when it raised."""
    try:
        outcome = check_gold(answer)
    except Exception as e:  # a gold the verifier chokes on is a failure of that row, not of the run
        return None, f"error ({type(e).__name__}: {e})"[:200]
    if outcome is None:
        return None, None
    return outcome, outcome.value if isinstance(outcome, Outcome) else repr(outcome)


def require(examples: Sequence[Example], check_gold: Callable[[str], Outcome | None], threshold: float,
            seed: int, **options: int) -> GoldCheck:  # fmt: skip
    """`check` (with its `cap` and `threads`), then a ConfigError when the share CORRECT is below `threshold`
    (reward.gold_check)."""
    result = check(examples, check_gold, seed, **options)
    if result.share < threshold:
        shown = "".join(f"\n  {id_}: gold {_short(gold)} -> {verdict}" for id_, gold, verdict in result.failures[:SHOWN])
        of = f"a seeded sample of {result.checked:,}" if result.sampled else f"{result.checked:,}"
        failed = len(result.failures)
        raise ConfigError(
            f"reward.gold_check: {result.percent} of {of} gold answers come back correct when the verifier scores them "
            f"as perfect completions, below the {threshold:.1%} required: rewards on this data would be wrong. "
            f"{failed:,} {'fails' if failed == 1 else 'fail'}, e.g.:{shown}\n"
            f"Check {FIXES}; reward.gold_check=0 skips this check."
        )
    return result


def startup_note(examples: Sequence[Example], check_gold: Callable[[str], Outcome | None] | None, threshold: float,
                 seed: int, unchecked: str = "reward.fn is a user function", **options: int) -> str:  # fmt: skip
    """Run the check as reward.gold_check says (`check_gold` None: nothing to check, for the reason `unchecked`); the
    start-up summary's words for it, e.g. "gold answers 100.0% readable"."""
    if check_gold is None:
        return f"gold answers not checked ({unchecked})"
    if threshold == 0:
        return "gold answers not checked (reward.gold_check=0)"
    result = require(examples, check_gold, threshold, seed, **options)
    if not result.checked:
        return "gold answers not checked (the data stores none: its scorer checks a solution)"
    return f"gold answers {result.percent} readable" + (f" (a sample of {result.checked:,})" if result.sampled else "")


def _short(gold: str) -> str:
    text = repr(gold)
    return text if len(text) <= 80 else text[:77] + "..."
