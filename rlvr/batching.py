"""The micro-batch plan: which rows go through each forward/backward pass (a memory knob only: the loss is invariant
to it, rlvr.algo's normalizers are the mini-batch's)."""

from __future__ import annotations


def micro_batches(lengths: list[int], *, max_rows: int, max_tokens: int) -> list[list[int]]:
    """Row indices grouped into micro-batches that each pad only to their own longest row.

    Rows are taken longest first; a micro-batch grows while its padded size (rows x its longest row) stays within
    max_tokens (0: no token budget) and its rows within max_rows. A row longer than max_tokens is a micro-batch alone.
    """
    plan: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):  # stable: equal lengths keep their order
        current = plan[-1] if plan else None
        if current is None or len(current) >= max_rows or (max_tokens and (len(current) + 1) * lengths[current[0]] > max_tokens):
            plan.append([i])
        else:
            current.append(i)
    return plan


def split_to(plan: list[list[int]], lengths: list[int], count: int) -> list[list[int]]:
    """The plan with its largest micro-batches (in padded tokens) halved until it has `count` of them (every FSDP2 rank
    must run as many forward/backward passes as the others). Needs count <= the number of rows."""
    plan = [list(p) for p in plan]
    while len(plan) < count:
        j = max((k for k in range(len(plan)) if len(plan[k]) > 1), key=lambda k: len(plan[k]) * lengths[plan[k][0]])
        half = len(plan[j]) // 2
        plan[j : j + 1] = [plan[j][:half], plan[j][half:]]
    return plan
