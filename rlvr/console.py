"""What a person sees: rlvr's own lines on the console, everything other libraries print in the run's log file.

`capture` points the process's standard output and error (file descriptors 1 and 2, so that C++ warnings, Python
loggers and warnings, progress bars and the verifier workers' output all follow) at a log file, and keeps copies of
the terminal for rlvr's own lines: `say` (notes), `warn`, `error` and the live progress bar. Until the run's folder is
settled (`log_to`, once the start-up checks know it) the log is an anonymous temporary file, copied into
`<output folder>/rlvr.log` then; a command that ends before that keeps it as rlvr-<time>-<pid>.log in the temporary
folder. vLLM is asked not to configure its own logging (VLLM_CONFIGURE_LOGGING=0): its records reach the root
logger like every library's, in one format.

With `logger.verbose=true` nothing is redirected: other libraries print to the console as they would without rlvr,
and the log holds rlvr's own lines. The few library messages a user must act on (RELAYED) reach the console as well
as the log. Outside `capture` (tests calling library code, `rlvr plan`) every function here writes to sys.stdout /
sys.stderr.
"""

from __future__ import annotations

import logging
import math
import os
import re
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

LOG_FILE = "rlvr.log"

# Library messages shown on the console too, each for what it says. The rest (vLLM's advice on LD_PRELOAD, its
# notes on chunked prefill and on its own seed, Triton's missing CPU backend, torch's deprecations) describe the
# libraries' own choices: nothing a user of rlvr can or should act on.
RELAYED: tuple[tuple[re.Pattern[str], str], ...] = (
    # transformers' load report: weights the checkpoint lacks start random (a wrong model class, a broken folder)
    (re.compile(r"LOAD REPORT(?s:.*)MISSING|newly initialized|not initialized from the model checkpoint"), "missing weights"),
    # a model whose code lives in its repository: it does not load (or loads wrongly) without trust_remote_code
    (re.compile(r"trust_remote_code"), "remote code"),
    # a tokenizer told that a text is longer than the model's context: what the model sees past it is garbage
    (re.compile(r"Token indices sequence length is longer than the specified maximum"), "prompt too long"),
)

_LOG_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"  # Hydra's job-log format


def relayed(message: str) -> bool:
    """Whether a library's message is one a user must see on the console."""
    return any(pattern.search(message) for pattern, _ in RELAYED)


class Console:
    """rlvr's own lines: to the terminal (`out`, `err`) and to the log (`log_fd`); the progress bar, when one is open,
    is kept below them. A quiet console (ranks other than 0 under torchrun) writes only errors to the terminal."""

    def __init__(self, out: TextIO | None = None, err: TextIO | None = None) -> None:
        self._out, self._err = out, err  # None: sys.stdout / sys.stderr at the time of writing
        self.log_fd: int | None = None
        self.quiet = False
        self.bar: Any = None  # a tqdm bar on `out` while a run's progress is live

    @property
    def out(self) -> TextIO:
        return self._out or sys.stdout

    @property
    def err(self) -> TextIO:
        return self._err or sys.stderr

    def write(self, text: str, *, error: bool = False, always: bool = False) -> None:
        if not self.quiet or always:
            stream = self.err if error else self.out
            if self.bar is not None and stream.isatty():
                from tqdm import tqdm

                tqdm.write(text, file=self.out)  # clears the bar, writes the line, redraws the bar
            else:
                stream.write(text + "\n")
                stream.flush()
        self.to_log(text)

    def to_log(self, text: str) -> None:
        if self.log_fd is not None:
            for stream in (sys.stdout, sys.stderr):  # what libraries wrote before this line stays before it
                stream.flush()
            os.write(self.log_fd, f"[{time.strftime('%Y-%m-%d %H:%M:%S')}][rlvr] {text}\n".encode(errors="replace"))


_console = Console()  # outside `capture`


def say(text: str) -> None:
    """One of rlvr's notes (the start-up summary, checkpoints, resume, the final folder)."""
    _console.write(text)


def detail(text: str) -> None:
    """A line for the log only (every resolved setting); on the console outside `capture`."""
    if _capture is None:
        _console.write(text)
    else:
        _console.to_log(text)


def warn(text: str) -> None:
    """A warning of rlvr's own (unreadable answers, dropped prompts)."""
    _console.write(text, error=True)


def error(text: str) -> None:
    """The error that ends the command: the last line it prints (on every rank)."""
    close_bar()
    _console.write(text, error=True, always=True)


def crash(prefix: str) -> None:
    """An unexpected exception (a bug, or a library's failure): its traceback on the console and in the log, which
    the first line names (kept in the temporary folder if the run's folder was not known yet)."""
    close_bar()
    if _capture is not None:
        _capture.keep()
        _console.log_fd = _capture.fd
    where = log_path()
    note = f" (other libraries' output: {where})" if where else ""
    _console.write(f"{prefix}{note}\n{traceback.format_exc().rstrip()}", error=True, always=True)


class Progress:
    """One run's progress: a live tqdm bar on a terminal (steps, ETA, reward, last held-out accuracy, tokens/s);
    elsewhere (a file, CI) a plain line every `every` steps, at evaluations and at the last step."""

    def __init__(self, total: int, initial: int, *, live: bool, every: int = 10) -> None:
        self.total, self.every = total, every
        self.start, self.first = time.monotonic(), initial
        self.accuracy: float | None = None
        self.live = live and not _console.quiet and _console.out.isatty()
        if self.live:
            from tqdm import tqdm

            _console.bar = tqdm(total=total, initial=initial, file=_console.out, unit="step", dynamic_ncols=True,
                                bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}]{postfix}")  # fmt: skip

    def update(self, m: dict[str, Any]) -> None:
        step = m["step"]
        if "eval/accuracy" in m:
            self.accuracy = m["eval/accuracy"]
        acc = _num(self.accuracy)
        reward, tokens = m.get("reward/mean"), m.get("perf/tokens_per_s", 0.0)
        if self.live and _console.bar is not None:
            _console.bar.set_postfix_str(f"reward {_num(reward)} | eval acc {acc} | {tokens:,.0f} tok/s", refresh=False)
            _console.bar.update(step - _console.bar.n)
            _console.to_log(self.line(step, reward, acc, tokens))
        elif step % self.every == 0 or step == self.total or "eval/accuracy" in m:
            _console.write(self.line(step, reward, acc, tokens))

    def line(self, step: int, reward: float | None, acc: str, tokens: float) -> str:
        done = step - self.first
        eta = (time.monotonic() - self.start) / done * (self.total - step) if done > 0 else math.nan
        eta_text = "-" if math.isnan(eta) else f"{int(eta) // 60}m{int(eta) % 60:02d}s"
        return f"step {step}/{self.total} | reward {_num(reward)} | eval acc {acc} | {tokens:,.0f} tok/s | ETA {eta_text}"

    def close(self) -> None:
        close_bar()


def _num(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.3f}"


def close_bar() -> None:
    if _console.bar is not None:
        _console.bar.close()
        _console.bar = None


class _Capture:
    """The redirection of fds 1 and 2 while a command runs (see the module's docstring)."""

    def __init__(self, verbose: bool) -> None:
        self.verbose = verbose
        _flush()
        self.saved = (os.dup(1), os.dup(2))  # the terminal (or whatever the command's output was)
        with tempfile.TemporaryFile() as anonymous:  # until log_to names the run's file
            self.fd = os.dup(anonymous.fileno())  # (the file lives on in the copy)
        self.path: Path | None = None
        if not verbose:
            self._point_at(self.fd)

    @staticmethod
    def _point_at(fd: int) -> None:
        _flush()
        os.dup2(fd, 1)
        os.dup2(fd, 2)

    def log_to(self, path: Path) -> None:
        """Move the log into `path` (appended to: a resumed run's log continues), what was written so far included,
        byte for byte."""
        if self.path == path:
            return
        _flush()
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        offset = 0
        while chunk := os.pread(self.fd, 1 << 20, offset):  # pread: the offset fds 1 and 2 share does not move
            os.write(fd, chunk)
            offset += len(chunk)
        if not self.verbose:
            self._point_at(fd)
        os.close(self.fd)
        self.fd, self.path = fd, path

    def keep(self) -> None:
        """A log not yet in a run's folder goes to the temporary folder (a command that ended before it was known)."""
        if self.path is None:
            self.log_to(Path(tempfile.gettempdir()) / f"rlvr-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log")

    def close(self) -> None:
        _flush()
        os.dup2(self.saved[0], 1)
        os.dup2(self.saved[1], 2)
        for fd in self.saved:
            os.close(fd)
        if self.path is None and os.fstat(self.fd).st_size:
            self.keep()  # nothing a library printed is lost
        os.close(self.fd)


def _flush() -> None:
    for s in (sys.stdout, sys.stderr):
        s.flush()


_capture: _Capture | None = None
_last_log: Path | None = None  # the last command's log (quiet_exit); os.devnull if it had nothing to keep


@contextmanager
def capture(*, verbose: bool) -> Iterator[None]:
    """Other libraries' output to the log, rlvr's to the console, for the block (a command)."""
    global _console, _capture, _last_log
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")  # (read when vLLM first configures its loggers)
    previous, outer = _console, _capture
    cap = _Capture(verbose)
    out, err = (open(fd, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False) for fd in cap.saved)
    _console, _capture = Console(out, err), cap
    _console.log_fd = cap.fd
    root = logging.getLogger()  # the library loggers that propagate, in one format (Hydra's job logging is off)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(_LOG_FORMAT))
    level, handlers = root.level, root.handlers[:]  # Hydra's own (its [HYDRA] lines) would print each record again
    root.handlers = [handler]
    root.setLevel(logging.INFO)
    show_warning = warnings.showwarning
    if not verbose:
        _attach_relay()
        warnings.showwarning = _relaying(show_warning)
    try:
        yield
    finally:
        close_bar()
        for name in _RELAY_LOGGERS:
            logging.getLogger(name).removeHandler(_RELAY)
        root.handlers = handlers
        root.setLevel(level)
        warnings.showwarning = show_warning
        cap.close()
        _last_log = cap.path or Path(os.devnull)
        _console, _capture = previous, outer
        for s in (out, err):
            s.close()


def log_to(folder: Path, rank: int = 0) -> None:
    """The run's folder is known (and writable): the log becomes `<folder>/rlvr.log` (`rlvr.rank<N>.log` on other
    ranks under torchrun, whose console then shows only errors)."""
    if _capture is None:
        return
    _capture.log_to(folder / (LOG_FILE if rank == 0 else f"rlvr.rank{rank}.log"))
    _console.log_fd = _capture.fd
    _console.quiet = rank != 0
    if not _capture.verbose:
        _attach_relay()  # loggers configured since the capture began (transformers' on first use)


def log_path() -> Path | None:
    """The current command's log file (None before its folder is known, or outside `capture`)."""
    return None if _capture is None else _capture.path


def quiet_exit() -> None:
    """At the process's end, after the command: point fds 1 and 2 at the last command's log, so the interpreter's
    teardown (nanobind's leak reports for Triton's bindings, atexit handlers, destructors) does not print after
    rlvr's last line. Nothing to do if no command captured anything (`rlvr plan`, `rlvr report`, a config error)."""
    if _last_log is None:
        return
    _flush()
    fd = os.open(_last_log, os.O_WRONLY | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


class _Relay(logging.Handler):
    """Copies a library's log record to the console when a user must act on it (RELAYED)."""

    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:  # a library's malformed record: its own handler reports it
            return
        if relayed(message):
            _console.write(f"{record.name}: {message}", error=True)


_RELAY = _Relay()
# the root logger, and the libraries' loggers that do not propagate to it (transformers' has its own handler)
_RELAY_LOGGERS = ("", "vllm", "transformers", "torch", "peft")


def _attach_relay() -> None:
    for name in _RELAY_LOGGERS:
        logger = logging.getLogger(name)
        if (name == "" or not logger.propagate) and _RELAY not in logger.handlers:
            logger.addHandler(_RELAY)


def _relaying(show: Any) -> Any:
    def showwarning(message: Any, category: type[Warning], filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        show(message, category, filename, lineno, file, line)
        if relayed(str(message)):
            _console.write(f"{category.__name__}: {message}", error=True)

    return showwarning
