"""Tools the model calls while it answers (rollout.tools). One protocol for every kind: find a call in the turn the
model just wrote, run it, format its result for the model. rlvr.multiturn drives the turns.

`python`: the model writes a fenced ```python block; the engine stops at its closing fence (PythonTool.CLOSE); the
block runs in the sandbox the code verifier uses (rlvr.verifiers.code's sandbox: bubblewrap, no network, no host files,
resource limits, seccomp, a wall-clock kill of the whole tree, capped output) and its stdout and stderr come back as a
```output block, after which the model goes on. Calls in one answer share state as a notebook's cells do: each call
runs the answer's earlier cells first, in one namespace, with their output discarded (an error in an earlier cell is
ignored there: the model saw it when that cell ran), then the new cell, whose last expression's value is shown as a
notebook shows it. Re-running costs the earlier cells' time again (measured in docs/measured/tools.md) and keeps no
process alive between turns. The sandbox runs the interpreter with its standard library only (no site-packages).

The user's own functions (`package.module:function`) are the other kind: rlvr.function_tools.

This module imports neither torch nor vllm.
"""

from __future__ import annotations

import re
import secrets
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from rlvr.verifiers import code as sandbox  # the code verifier's front: its sandbox

if TYPE_CHECKING:
    from rlvr.types import ToolCall


@dataclass(frozen=True)
class ToolResult:
    output: str  # what the tool printed (stdout and stderr, in order), before any cut for the token budget
    status: str  # "ok" | "error" | "timeout" | "limit"
    seconds: float


# What the model is shown after a turn's calls: pieces of text in order, each (text, markup). Markup is the chat
# template's own text (its special tokens are tokens: "<|im_start|>"); everything else, a tool's output above all, is
# encoded with special-token text split into plain text, so no program or function can end the model's turn.
Piece = tuple[str, bool]


class Tool(Protocol):
    name: str
    stop: tuple[str, ...]  # stop strings that end a turn which may hold a call
    turn_end: bool  # calls are also looked for in a turn the model ended itself (its end-of-turn token)

    def parse(self, turn: str) -> list[str]:
        """The calls in the model's text since the last tool output (it ends at a stop string or at the model's end
        of turn), in order; [] when it holds none."""

    def run(self, request: str, earlier: list[ToolCall]) -> ToolResult:
        """Run `request`; `earlier` holds this answer's earlier calls of this tool, in order (request, output, status)."""

    def format(self, outputs: list[str]) -> list[Piece]:
        """What the model is shown after one turn's calls, given their outputs (each already cut to its budget)."""


@dataclass(frozen=True)
class PythonLimits:
    cpu_s: float  # CPU seconds of one call (its earlier cells' re-run included)
    wall_s: float  # wall-clock seconds of one call, sandbox start included
    memory_mb: int  # address space
    sandbox: bool  # False: rollout.tool.sandbox=none (the harness's limits and seccomp filter only)


# The program the sandbox runs for a call: the cells travel as a repr() literal (never spliced in as code), are parsed
# and run inside the sandbox, the earlier ones silenced; `random` is seeded first, so a re-run cell draws what it drew
# when it ran. The new cell's output is framed by the call's two marks: without the first, the re-run of the earlier
# cells did not finish; without the second, the new cell did not (the interpreter exited or was killed). Names start
# with _r so that the cells' own rarely clash.
_CELL = "<cell>"
_PROGRAM = """\
import ast as _ra, linecache as _rl, random as _rr, sys as _rs, traceback as _rt
_rr.seed(0)
_rcells = {cells!r}
_rns = {{"__name__": "__main__", "__builtins__": __builtins__}}
def _rrun(src, number, show):
    name = "<cell %d>" % number
    _rl.cache[name] = (len(src), None, src.splitlines(True), name)
    tree = _ra.parse(src, name)
    last = tree.body.pop() if show and tree.body and isinstance(tree.body[-1], _ra.Expr) else None
    exec(compile(tree, name, "exec"), _rns)
    if last is not None:
        value = eval(compile(_ra.Expression(last.value), name, "eval"), _rns)
        if value is not None:
            print(repr(value))
_rout = _rs.stdout
_rnull = open("/dev/null", "w")
for _ri, _rc in enumerate(_rcells[:-1]):
    _rs.stdout = _rs.stderr = _rnull
    try:
        _rrun(_rc, _ri + 1, False)
    except BaseException:
        pass
_rs.stdout = _rs.stderr = _rout
print({start!r}, end="", flush=True)
try:
    _rrun(_rcells[-1], len(_rcells), True)
except SystemExit:
    print({end!r}, end="", flush=True)
    raise
except BaseException as _re:
    _rframes = [f for f in _rt.extract_tb(_re.__traceback__) if f.filename.startswith("<cell")]
    if _rframes:
        print("Traceback (most recent call last):\\n" + "".join(_rt.format_list(_rframes[-5:])), end="")
    print("".join(_rt.format_exception_only(type(_re), _re)), end="")
    print({end!r}, end="", flush=True)
    _rs.exit(124 if isinstance(_re, MemoryError) else 1)  # 124: the harness's "memory" exit kind
print({end!r}, end="", flush=True)
"""
_OPEN_FENCE = re.compile(r"^```(?:python3|python|py)[ \t]*\n", re.MULTILINE)
_STATUS = {None: "ok", "timeout": "timeout", "memory": "limit"}  # the harness's exit kinds; any other is "error"
# said after a call whose interpreter did not survive it; the answer's next call starts a fresh one (PythonTool.run)
RESTART = "; the interpreter restarts: the next cell will not see this answer's earlier variables]"
_CUT_NOTE = "\n[output cut: too long" + RESTART
_EXIT_NOTE = "\n[the interpreter exited" + RESTART


class PythonTool:
    """Python in the sandbox, cells sharing state (module docstring)."""

    name = "python"
    CLOSE = "\n```\n"
    stop: tuple[str, ...] = (CLOSE,)
    turn_end = False

    def __init__(self, limits: PythonLimits, output_bytes: int = 1 << 16) -> None:
        self.limits = limits
        self.output_bytes = output_bytes  # what the sandbox reads back; the shown output is cut further by tokens

    def parse(self, turn: str) -> list[str]:
        """[the code of the python block that the turn closes last]: the text after the last opening fence (at the
        start of a line) up to the closing fence that ends the turn. [] when the turn does not end in a closing fence
        or no python block is open before it (a closed ``` of another language, or an opening bare fence)."""
        if not turn.endswith(self.CLOSE):
            return []
        body = turn[: len(turn) - len(self.CLOSE) + 1]  # keep the newline that ends the code
        opened = list(_OPEN_FENCE.finditer(body))  # opening fences at the start of a line
        if not opened:
            return []
        code = body[opened[-1].end() :]
        if "\n```" in "\n" + code:  # that block closed earlier: this fence closes something else
            return []
        return [code]

    def run(self, request: str, earlier: list[ToolCall]) -> ToolResult:
        """Run `request` after re-running the answer's earlier cells: those since the last call whose interpreter did not
        survive it (timed out, output cut, exited), which would only stop the re-run again. Each re-run cell brings
        its own rollout.tool.cpu_s and timeout_s to the call's limits, so the new cell always has its own whole."""
        cells = [c.request for c in earlier[_fresh_from(earlier) :]]
        start_mark, end_mark = (f"\x1erlvr-{secrets.token_hex(6)}-{side}\x1e" for side in ("start", "end"))
        program = _PROGRAM.format(cells=[*cells, request], start=start_mark, end=end_mark)
        job = {"mode": "stdio", "program": program, "setup": "", "tests": [{"stdin": ""}]}
        lim, share = self.limits, 1 + len(cells)
        limits = sandbox.Limits(cpu_s=lim.cpu_s * share, wall_s=lim.wall_s * share, memory_bytes=lim.memory_mb << 20,
                                output_bytes=self.output_bytes)  # fmt: skip
        start = time.monotonic()
        try:
            result = sandbox.run_sandboxed(job, limits, wall_s=limits.wall_s + 1.0, sandbox=lim.sandbox)
        except (sandbox.SandboxError, OSError) as e:  # the sandbox itself failed: this call's error, not the run's
            return ToolResult(f"[the tool could not run: {str(e)[:200]}]", "error", time.monotonic() - start)
        seconds = time.monotonic() - start
        case = next((e for e in result.events if e[0] == "case" and len(e) == 5), None)
        if case is None:  # no report: the whole sandbox was killed (wall clock, output) or did not start
            if result.timed_out:
                return ToolResult(f"[timed out after {lim.wall_s:g} s" + RESTART, "timeout", seconds)
            if any(e[0] == "compile" for e in result.events):  # a syntax error: the harness compiled the program first
                return ToolResult("[the cell could not be compiled]", "error", seconds)
            return ToolResult("[the tool gave no result]", "error", seconds)
        _, _, kind, out, cut = case
        text = out.encode("latin-1", "replace").decode("utf-8", "replace") if isinstance(out, str) else ""
        before, started, text = text.partition(start_mark)
        if not started:  # the earlier cells did not run to the end this time (they draw on the clock, the machine...)
            return ToolResult("[this answer's earlier cells could not be re-run before this one; the interpreter "
                              "restarts: the next cell will not see their variables]", "error", seconds)  # fmt: skip
        text, finished, _ = text.partition(end_mark)
        if cut:
            return ToolResult(text + _CUT_NOTE, "limit", seconds)
        if kind == "timeout":
            return ToolResult(text + f"\n[timed out: a call may take {lim.cpu_s:g} CPU seconds, {lim.wall_s:g} s" + RESTART,
                              "timeout", seconds)  # fmt: skip
        if kind == "memory":
            return ToolResult(text + f"\n[MemoryError: over {lim.memory_mb} MiB]", "limit", seconds)
        if not finished:  # os._exit, a signal of its own: the interpreter is gone
            return ToolResult(text + _EXIT_NOTE, "error", seconds)
        return ToolResult(text, _STATUS.get(kind, "error"), seconds)

    def format(self, outputs: list[str]) -> list[Piece]:
        return [("```output\n" + output.removesuffix("\n") + "\n```\n", False) for output in outputs]


def _fresh_from(earlier: list[ToolCall]) -> int:
    """Where the interpreter of the answer's next call starts: after the last call it did not survive."""
    stopped = [i for i, c in enumerate(earlier) if c.status == "timeout" or (c.status == "limit" and c.output.endswith(_CUT_NOTE))
               or (c.status == "error" and c.output.endswith(RESTART))]  # fmt: skip
    return stopped[-1] + 1 if stopped else 0


def check(names: list[str], sandboxed: bool) -> None:
    """Before any model loads: the sandbox the python tool runs in works (ConfigError naming the package or the kernel
    setting if not); rollout.tool.sandbox=none warns instead."""
    from rlvr import console
    from rlvr.config import ConfigError

    if "python" not in names:
        return
    if not sandboxed:
        console.warn("rlvr: warning: rollout.tool.sandbox=none: the model's tool calls run WITHOUT a sandbox, with your "
                     "rights (only CPU, memory and process limits hold). Use it only where bubblewrap cannot run.")  # fmt: skip
        return
    try:
        sandbox.check_sandbox()
    except sandbox.SandboxError as e:
        raise ConfigError(f"rollout.tools=[python] needs a working sandbox: {e}. (rollout.tool.sandbox=none runs the "
                          f"calls without one, with your rights.)") from None  # fmt: skip
