"""make mutation: mutmut over the pure core, then its numbers and surviving mutants (docs/mutation.md).

The pure core is the functions matched by CORE below: all of rlvr/algo.py, the micro-batch plan (rlvr/batching.py),
the answer extraction (rlvr/verifiers/extraction.py), the math verifier's normalization and equivalence, the
arithmetic and countdown verifiers, and the code verifier's test record (rlvr/verifiers/code/record.py: parsing and
validation only; the sandboxed runs are not mutated). Not in it: the math verifier's refusal estimate and work-budget tracer (resource
bounds, not the answer), its logging filter and `_warm_up` (sympy's lazy imports). mutmut 3 leaves decorated
functions alone, so the verifier's caches wrap plain functions (`_parse_uncached`, `_equivalent_uncached`), which are
mutated.
mutmut's settings (files, tests, isolation) are in pyproject.toml's [tool.mutmut].

Each run starts from a fresh mutants/ folder (mutmut's results there would otherwise be reused), prints
total / killed / timeout / survived and the kill rate, lists every survivor with its diff and its fate from
EQUIVALENT, and exits 1 if a survivor is not explained or the kill rate is under MIN_KILL_RATE.
Usage: python scripts/mutation.py [--no-run] (--no-run: report on the mutants/ folder of the last run).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MUTMUT = Path(sys.executable).with_name("mutmut")
MIN_KILL_RATE = 0.90

_MATH = "rlvr.verifiers.math.x_"
CORE = [
    "rlvr.algo.*",
    "rlvr.batching.*",
    "rlvr.verifiers.arithmetic.*",
    "rlvr.verifiers.code.record.*",
    "rlvr.verifiers.countdown.*",
    "rlvr.verifiers.extraction.*",
    *(
        f"{_MATH}{name}__mutmut_*"
        for name in (
            "format_score",
            # normalization and equivalence
            "normalize", "_as_fraction", "_parse_uncached", "_sympy_equivalent", "_equivalent_uncached", "_items",
            "_judge", "is_equivalent", "verify", "check_gold",
        )
    ),
]

# Survivors whose behaviour cannot differ from the original's (excluded from the kill rate's denominator):
# mutant name -> why. Every other survivor is a missing test.
_INT_LENGTHS = "`.to(None)` is a no-op: the lengths stay int64, and a float tensor divided by them has the same dtype and values"
_LAST_DIM = "dim=+1 is dim=-1 on the documented 2-D [N, T] inputs"
_DUAL_UNITS = ("for A < 0 (the only units counted) the original fires iff max(r, 1 - clip_low) > c, i.e. iff r > c since "
               "1 - clip_low <= 1 < c; with this clamp bound it still fires iff r > c (config: 0 <= clip_low < 1, clip_high >= 0)")
_CD = "rlvr.verifiers.countdown.x_"
_EX = "rlvr.verifiers.extraction.x_"
_UNSEEN = "_Rejected's message is never seen: score_expression catches it and returns False"
_CLOSE_AT_0 = "close = 0: no `<answer>` can start before position 0, so open_ is -1 either way"
_FIRST_PIECE = "only the first piece of the split is used: the number of splits does not change it"
_ORDER = ("locate_answer keeps the largest (tier, at, -order) over all finds, and one extractor's finds never share "
          "(tier, at): the order of its list does not matter")
_OVER_BUDGET = "a parse past the budget returns None, and its only caller (_sympy_equivalent) returns TIMEOUT on None whatever the count"
EQUIVALENT: dict[str, str] = {
    "rlvr.algo.x_importance_ratio__mutmut_17": _INT_LENGTHS,
    "rlvr.algo.x_aggregate__mutmut_24": _INT_LENGTHS,
    "rlvr.algo.x_surrogate__mutmut_39": _INT_LENGTHS,
    "rlvr.algo.x_importance_ratio__mutmut_22": _LAST_DIM,
    "rlvr.algo.x_importance_ratio__mutmut_32": _LAST_DIM,
    "rlvr.algo.x_aggregate__mutmut_26": _LAST_DIM,
    "rlvr.algo.x_aggregate__mutmut_32": _LAST_DIM,
    "rlvr.algo.x_metric_units__mutmut_7": _LAST_DIM,
    "rlvr.algo.x_surrogate__mutmut_44": _LAST_DIM,
    "rlvr.algo.x_surrogate__mutmut_55": _LAST_DIM,
    "rlvr.algo.x_overlong_penalty__mutmut_29": "at |o| = L_max - L_cache the shaped branch is (start - |o|) / buffer = 0 too",
    "rlvr.algo.x_overlong_penalty__mutmut_37": "at |o| = L_max the shaped branch is -buffer / buffer * factor = -factor "
                                               "too (up to float rounding of start - L_max)",
    "rlvr.algo.x_policy_loss_terms__mutmut_61": "at A = 0 the surrogate is 0 and so is the cap -A * c (and neither has a gradient)",
    "rlvr.algo.x_policy_loss_terms__mutmut_204": "at A = 0 pg_u = 0 is not > -A * c = 0 either",
    **{f"rlvr.algo.x_policy_loss_terms__mutmut_{n}": _DUAL_UNITS for n in (190, 191, 192, 194, 197, 198)},
    "rlvr.algo.x_surrogate__mutmut_106": "at A = 0 the SAPO loss -A f(r) is 0 (and so is its gradient) whichever tau gates it",
    "rlvr.algo.x_as_floats__mutmut_5": "`.to(None)` is a no-op and torch.stack promotes to the widest dtype: the floats are "
                                       "the same (every float dtype widens exactly to float64)",
    f"{_EX}_answer_tag__mutmut_10": "rfind's start None is 0",
    f"{_EX}_answer_tag__mutmut_19": "close = 0: an 8-character `<answer>` cannot lie in text[0:0], so start is -1 either way",
    f"{_EX}_answer_tag__mutmut_20": "close = 0: an 8-character `<answer>` cannot lie in text[0:0], so start is -1 either way",
    f"{_EX}_answer_tag__mutmut_22": "only `start >= 0` is tested: -2 is as negative as -1",
    f"{_EX}_answer_tag__mutmut_31": "an empty value's find reaches only locate_answer, which skips an empty answer (`if value and ...`)",
    f"{_EX}_last_number__mutmut_1": "'' is falsy like None and is only ever replaced by a match",
    f"{_EX}_last_number__mutmut_7": "only last_number finds FALLBACK, so its position is compared only with its own find's "
                                    "(extractor listed twice): None == None as the two equal positions were",
    f"{_EX}_last_match__mutmut_1": "'' is falsy like None and is only ever replaced by a match",
    f"{_EX}_last_match__mutmut_11": "value is read only when something was found (`found and value`)",
    f"{_EX}_last_match__mutmut_20": "a found line with an empty value gives a find with text '', which the only caller "
                                    "(_find's hashes) drops: '' holds no math",
    f"{_EX}_predicate__mutmut_5": "an `is` match starts at 'i', a math span at '$' or '\\': they never start at the same place",
    f"{_EX}_predicate__mutmut_14": "a value found only at or after the `is` gives _THEN an empty range (pos > endpos): no match, as "
                                   "with no value; one found before it is the same match (_FIRST_VALUE's 1-2 characters "
                                   "cannot straddle the 'i' of `is`)",
    f"{_EX}_tidy__mutmut_6": _FIRST_PIECE,
    f"{_EX}_tidy__mutmut_8": _FIRST_PIECE,
    f"{_EX}_tidy__mutmut_18": _FIRST_PIECE,
    f"{_EX}_tidy__mutmut_20": _FIRST_PIECE,
    f"{_EX}_tidy__mutmut_29": "`before` is read only when there are spans (`spans and ...` and the block under it)",
    **{f"{_EX}_answer_lines__mutmut_{n}": _ORDER for n in (65, 67)},
    f"{_EX}boxes__mutmut_31": "an earlier box whose command starts before this box's content but whose content starts "
                              "inside it would need its `{` after this one's, but this `{` cleared the pending command",
    f"{_EX}locate_answer__mutmut_27": "keys tie only for one extractor's finds at one (tier, at), which never happens: "
                                      "`>=` and `>` pick the same",
    f"{_EX}_stated__mutmut_12": "a found newline is at or after `start`, and every caller's start is > 0 (after a marker)",
    f"{_EX}_stated__mutmut_13": "a found newline is at or after `start`, and every caller's start is > 0 (after a marker)",
    f"{_MATH}_as_fraction__mutmut_9": "dividing a Fraction by -1 is multiplying it by -1",
    f"{_MATH}normalize__mutmut_113": "format 'F' differs from 'f' only for inf/nan, which the scientific-notation pattern "
                                    "never matches",
    f"{_MATH}_equivalent_uncached__mutmut_1": "an empty side that goes on still ends False: the strict comparison fails, "
                                             "'' is no fraction, and math_verify parses '' to [] (all strings)",
    f"{_MATH}_equivalent_uncached__mutmut_26": "with no '.', both sides are exact rationals, and math_verify compares "
                                              "rationals symbolically ('Only do this when one of the two is a float'): "
                                              "it finds unequal rationals unequal too",
    f"{_MATH}_parse_uncached__mutmut_10": _OVER_BUDGET,
    f"{_MATH}_parse_uncached__mutmut_11": _OVER_BUDGET,
    f"{_MATH}_sympy_equivalent__mutmut_8": "a None parse is an over-budget one, which reports WORK_CALLS + 1 calls: `left` "
                                          "is then < 0 and the pair a TIMEOUT either way",
    f"{_MATH}_judge__mutmut_25": "_items is >= 1, so `_items(...) < n` is false for n = 1 anyway",
    f"{_MATH}_judge__mutmut_29": "an INCORRECT box group of n items whose last n boxes are single items is those n boxes "
                                "(deduplicated): the same items, which math_verify compares as a set ('2, 1' equals "
                                "'1, 2'), so INCORRECT again",
    "rlvr.verifiers.code.record.x_validate__mutmut_39": "the default only feeds the float_tol check, which 0 and 1 both pass",
    "rlvr.verifiers.code.record.x_encode__mutmut_3": "json reads ensure_ascii by truth value: None is False",
    "rlvr.verifiers.code.record.x_encode__mutmut_4": "json reads allow_nan by truth value: None is False",
    **{f"{_CD}_evaluate__mutmut_{n}": _UNSEEN for n in (3, 4, 5, 37, 38)},
    f"{_CD}extract_expression__mutmut_12": "rfind's start None is 0",
    **{f"{_CD}extract_expression__mutmut_{n}": _CLOSE_AT_0 for n in (21, 22)},
    f"{_CD}extract_expression__mutmut_24": "only `open_ >= 0` is tested: -2 is as negative as -1",
    f"{_CD}extract_expression__mutmut_29": "'' found nowhere ends as None too: it strips to '' and `found if ... else None`",
    f"{_CD}extract_expression__mutmut_41": "`c in 'XX+-*/XX'` for one character c of a run: runs hold no 'X'",
}

DETECTED = {"killed", "timeout", "segfault"}
STATUS = {1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests", 34: "skipped", 36: "timeout",
          -24: "timeout", 24: "timeout", 152: "timeout", 255: "timeout", -11: "segfault", -9: "segfault", None: "not checked"}


def in_core(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in CORE)


def results() -> dict[str, str]:
    """mutant name -> status, for the core's mutants, from mutmut's .meta files."""
    found: dict[str, str] = {}
    for meta in (REPO / "mutants").rglob("*.py.meta"):
        for name, code in json.loads(meta.read_text())["exit_code_by_key"].items():
            if in_core(name):
                found[name] = STATUS.get(code, "suspicious")
    return found


def diff(name: str) -> str:
    out = subprocess.run([str(MUTMUT), "show", name], cwd=REPO, capture_output=True, text=True)
    lines = [line for line in out.stdout.splitlines() if line.startswith(("+", "-")) and not line.startswith(("+++", "---"))]
    return " / ".join(line.strip() for line in lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-run", action="store_true", help="report on the last run's mutants/ folder")
    args = parser.parse_args()
    start = time.monotonic()
    if not args.no_run:
        shutil.rmtree(REPO / "mutants", ignore_errors=True)
        log = REPO / "mutants.log"
        with log.open("w") as f:
            rc = subprocess.run([str(MUTMUT), "run", *CORE], cwd=REPO, stdout=f, stderr=subprocess.STDOUT).returncode
        if rc:
            print(log.read_text()[-3000:])
            print(f"mutmut run failed (exit {rc}); its output: {log}")
            return rc
    status = results()
    if not status:
        print("no mutants of the pure core in mutants/: run without --no-run")
        return 1
    counts = Counter(status.values())
    survivors = sorted(name for name, s in status.items() if s not in DETECTED)
    equivalent = [name for name in survivors if name in EQUIVALENT]
    unexplained = [name for name in survivors if name not in EQUIVALENT]
    detected = sum(counts[s] for s in DETECTED)
    rate = detected / len(status)
    rate_eq = detected / max(1, len(status) - len(equivalent))
    print(f"mutants: {len(status)}  " + "  ".join(f"{k}: {v}" for k, v in sorted(counts.items())))
    print(f"kill rate: {detected}/{len(status)} = {rate:.1%}; without the {len(equivalent)} equivalent mutants: "
          f"{detected}/{len(status) - len(equivalent)} = {rate_eq:.1%}")
    for name in survivors:
        fate = f"equivalent: {EQUIVALENT[name]}" if name in EQUIVALENT else "NOT EXPLAINED (missing test?)"
        print(f"  {status[name]:9} {name}: {diff(name)}\n            -> {fate}")
    stale = sorted(set(EQUIVALENT) - set(survivors))
    if stale:
        print(f"listed as equivalent but not surviving (renumbered? update EQUIVALENT): {stale}")
    if not args.no_run:
        print(f"make mutation: {time.monotonic() - start:.0f} s")
    ok = not unexplained and rate_eq >= MIN_KILL_RATE
    print("OK" if ok else f"FAILED: {len(unexplained)} unexplained survivors, kill rate {rate_eq:.1%} "
          f"(required: {MIN_KILL_RATE:.0%})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
