"""Run untrusted Python in bubblewrap: the model's program and its tests, with nothing of the host in reach.

    result = sandbox.run(job, Limits(), wall_s=5.0)   # job: the harness's JSON job; result.events: what it saw

Layers, outermost first:
1. bubblewrap (Debian's `bubblewrap`, a maintained tool; not hand-made namespaces): new user, PID, network, IPC, UTS
   and cgroup namespaces; no network but a loopback of its own; no /proc at all (no process, descriptor, memory map or
   mount table is there to read: /proc/self/mountinfo would name the host's folders and devices, which bubblewrap's
   bind mounts cannot hide); a read-only view of only the interpreter's files and the system libraries it links (no
   /etc, /home, /root, /work, host /tmp), with the root and /dev read-only; a fresh size-capped tmpfs /tmp as the only
   writable folder and the working one; no home; a clean environment; a new terminal session; killed with its parent.
   When rlvr runs as root, the sandbox joins a user namespace of its own (root_user_namespace) and the harness becomes
   `nobody` there: the kernel exempts uid 0 from RLIMIT_NPROC. Before it does, it mounts its own /tmp over
   bubblewrap's with a cap on files as well as bytes (tmp_inodes: bubblewrap cannot set a tmpfs's nr_inodes, and a
   tmpfs counts no bytes for an empty file); as another user the harness has no right to mount, and /tmp keeps
   bubblewrap's byte cap only.
2. The harness (harness.py, program.py, judge.py and runner.py beside this file) forks the process that runs the model's code (the program's, or each
   stdin/stdout case's), which closes the events' descriptor, sets resource limits (CPU seconds, address space, file
   size, open files, threads, no core), makes itself non-dumpable and installs a seccomp filter that refuses to create
   processes and namespaces (fork, vfork, clone without CLONE_THREAD, clone3, unshare, setns), before any model code
   runs; the harness, which judges the functions tests apart from the program, confines itself the same way.
3. Here: a wall-clock kill of the whole sandbox (its process group; the PID namespace takes every process in it
   along), and caps on the bytes read back from it (events, stdout, stderr), past which it is killed.

`check()` starts one trivial sandbox and says, in words a user can act on, why it cannot (bubblewrap missing,
unprivileged user namespaces off); the code verifier refuses to start without a working sandbox.
"""

from __future__ import annotations

import functools
import json
import marshal
import os
import platform
import selectors
import shutil
import signal
import struct
import subprocess
import sys
import sysconfig
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

# the harness: its modules, run inside the sandbox in this order as one namespace (harness.py's docstring)
RUNNER = tuple(Path(__file__).with_name(name) for name in ("harness.py", "program.py", "judge.py", "runner.py"))
# the interpreter's program: read the harness's code objects and its job from stdin, run them, then main(job)
BOOT = ("import marshal,os,sys;f=sys.stdin.buffer;c=marshal.load(f);j=marshal.load(f);sys.stdin.close();"
        "g={'__name__':'rlvr_runner'};[exec(x,g) for x in c];g['main'](j);os._exit(0)")  # no teardown: events are sent
MAX_EVENT_BYTES = 8 << 20  # the events one run may send back (values of every test)
MAX_STDERR_BYTES = 64 << 10  # bwrap's and the harness's own error text
INSTALL = ("apt-get install bubblewrap (Debian/Ubuntu), dnf install bubblewrap (Fedora/RHEL), or your distribution's "
           "'bubblewrap' package")  # fmt: skip
USERNS = ("unprivileged user namespaces must be allowed: sysctl kernel.unprivileged_userns_clone=1 (Debian), "
          "user.max_user_namespaces > 0, and on Ubuntu 24.04+ kernel.apparmor_restrict_unprivileged_userns=0 or an "
          "AppArmor profile for bwrap")  # fmt: skip


class SandboxError(RuntimeError):
    """The sandbox itself could not run (not the program's fault)."""


@dataclass(frozen=True)
class Limits:
    """What one run may use. cpu_s is per process (the functions run; each stdio case); wall_s per stdio case."""

    cpu_s: float = 2.0
    wall_s: float = 4.0
    memory_bytes: int = 1 << 30  # address space per process
    file_bytes: int = 1 << 20  # the largest file a program may write
    open_files: int = 64
    processes: int = 64  # threads (new processes are refused by the seccomp filter)
    output_bytes: int = 1 << 16  # stdout read back per stdio case / per run
    tmp_bytes: int = 16 << 20  # the writable working folder (a tmpfs)
    tmp_inodes: int = 10_000  # files, folders and links it may hold (where rlvr runs as root: the module docstring)
    recursion: int = 200_000  # the highest sys.setrecursionlimit a program gets: a recursion bomb ends in ~0.5 s of CPU
    int_digits: int = 4300  # sys.set_int_max_str_digits: Python's own default, so str() of a huge int fails fast


@dataclass
class RunResult:
    events: list[list] = field(default_factory=list)  # the harness's events, in order
    timed_out: bool = False  # the wall-clock kill fired
    output_cut: bool = False  # more than the cap of events or output came back: killed
    exit_code: int | None = None
    seconds: float = 0.0  # wall time from start to exit
    stderr: str = ""  # bwrap's or the harness's own complaint (the program's stderr is not read back in stdio cases)


# The seccomp filter: refuse process creation (fork, vfork, clone without CLONE_THREAD; clone3 says ENOSYS so that
# glibc falls back to clone) and new or other namespaces (unshare, setns). Each instruction is struct sock_filter {u16 code, u8 jt, u8 jf, u32 k}.
_ARCH = {"x86_64": (0xC000003E, {"fork": 57, "vfork": 58, "unshare": 272, "setns": 308, "clone": 56, "clone3": 435}),
         "aarch64": (0xC00000B7, {"unshare": 97, "setns": 268, "clone": 220, "clone3": 435})}  # fmt: skip
_LD, _JEQ, _JSET, _JGE, _RET = 0x20, 0x15, 0x45, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, JSET, JGE, BPF_RET|K
_ALLOW, _KILL, _ERRNO = 0x7FFF0000, 0x80000000, 0x00050000  # SECCOMP_RET_ALLOW, _KILL_PROCESS, _ERRNO
_EPERM, _ENOSYS, _CLONE_THREAD = 1, 38, 0x00010000


@functools.cache
def seccomp_filter(machine: str | None = None) -> bytes:
    """The filter's BPF program for `machine` (default: this one's architecture); SandboxError where it is not known."""
    machine = machine or platform.machine()
    if machine not in _ARCH:
        raise SandboxError(f"the code sandbox's seccomp filter knows x86_64 and aarch64, not {machine}")
    arch, numbers = _ARCH[machine]
    code = [(_LD, 0, 0, 4), (_JEQ, 1, 0, arch), (_RET, 0, 0, _KILL), (_LD, 0, 0, 0)]  # another ABI: killed
    code += [(_JGE, 0, 1, 0x40000000), (_RET, 0, 0, _KILL)]  # x86_64's x32 numbers: killed
    for nr in (numbers[n] for n in ("fork", "vfork", "unshare", "setns") if n in numbers):
        code += [(_JEQ, 0, 1, nr), (_RET, 0, 0, _ERRNO | _EPERM)]
    code += [(_JEQ, 0, 1, numbers["clone3"]), (_RET, 0, 0, _ERRNO | _ENOSYS)]
    code += [(_JEQ, 0, 3, numbers["clone"]), (_LD, 0, 0, 16), (_JSET, 1, 0, _CLONE_THREAD)]  # 16: args[0]'s low word
    code += [(_RET, 0, 0, _ERRNO | _EPERM), (_RET, 0, 0, _ALLOW)]
    return b"".join(struct.pack("=HBBI", *ins) for ins in code)


@functools.cache
def interpreter() -> tuple[str, tuple[str, ...]]:
    """(the Python binary the sandbox runs, the host folders it needs read-only): rlvr's own interpreter, outside
    any virtual environment (no site-packages of rlvr's are reachable: it runs with -I -S)."""
    prefix = Path(sys.base_prefix).resolve()
    binary = Path(os.path.realpath(sys.executable))
    if not binary.is_relative_to(prefix):  # a venv whose python is a copy: the base installation's
        version = f"python{sys.version_info.major}.{sys.version_info.minor}"
        binary = next((p for p in (prefix / "bin" / version, prefix / "bin" / "python3") if p.exists()), binary)
    if prefix in (Path("/usr"), Path("/usr/local"), Path("/")):  # a system Python: its binary and standard library
        paths = {str(binary), sysconfig.get_paths(vars={"base": str(prefix), "platbase": str(prefix)})["stdlib"],
                 sysconfig.get_paths(vars={"base": str(prefix), "platbase": str(prefix)})["platstdlib"]}  # fmt: skip
        return str(binary), tuple(sorted(p for p in paths if Path(p).exists()))
    return str(binary), (str(prefix),)


SANDBOX_UID = 65534  # who the program is when rlvr runs as root (nobody)


@functools.cache
def root_user_namespace() -> int | None:
    """As root: a user namespace that maps 0 and SANDBOX_UID to themselves, as a file descriptor bwrap joins
    (--userns); the harness then becomes SANDBOX_UID before anything else. None for any other user (bwrap makes its
    own namespace, and the harness keeps the user's uid there).

    Why: the kernel never applies RLIMIT_NPROC to processes of the host's uid 0, which a sandbox made by root runs as
    (its namespace maps to root), so a thread bomb would be bounded only by the address space. As SANDBOX_UID the
    limit holds; bwrap still mounts as root, so the interpreter's files stay reachable under a 0700 /root."""
    if os.geteuid() != 0:
        return None
    make = ("import ctypes,sys\nif ctypes.CDLL(None).unshare(0x10000000): sys.exit(1)\n"  # CLONE_NEWUSER
            "sys.stdout.write('in'); sys.stdout.flush(); sys.stdin.read()")  # fmt: skip
    holder = subprocess.Popen([sys.executable, "-I", "-S", "-c", make], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert holder.stdin is not None and holder.stdout is not None
    try:
        if holder.stdout.read(2) != b"in":
            raise SandboxError("could not create a user namespace for the sandbox (unshare(CLONE_NEWUSER) failed)")
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/{holder.pid}/{name}", "w") as f:
                f.write(f"0 0 1\n{SANDBOX_UID} {SANDBOX_UID} 1\n")
        return os.open(f"/proc/{holder.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)  # the namespace lives on with it
    finally:
        holder.stdin.close()
        holder.wait()


def bwrap_argv(limits: Limits, seccomp_fd: int | None, userns_fd: int | None) -> list[str]:
    """The bubblewrap command line that starts the harness (see the module docstring for each choice)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxError(f"bubblewrap (bwrap) is not installed: {INSTALL}")
    python, python_paths = interpreter()
    # as root: join root_user_namespace(); the harness becomes SANDBOX_UID itself (bwrap's --uid cannot mount then)
    user = ["--unshare-user", "--disable-userns"] if userns_fd is None else ["--userns", str(userns_fd)]
    argv = [bwrap, *user, "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", "--clearenv",
            "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "LANG", "C.UTF-8", "--setenv", "PYTHONHASHSEED", "0",
            "--hostname", "sandbox"]  # fmt: skip
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    for lib in ("/usr/lib", "/usr/lib64", "/lib", "/lib64", "/lib32", "/usr/lib32"):  # the system libraries
        path = Path(lib)
        if path.is_symlink():
            argv += ["--symlink", os.readlink(path), lib]
        elif path.is_dir():
            argv += [*_open_parents(lib), "--ro-bind", lib, lib]
    for folder in python_paths:
        argv += [*_open_parents(folder), "--ro-bind", folder, folder]
    argv += ["--dev", "/dev", "--size", str(limits.tmp_bytes), "--perms", "1777", "--tmpfs", "/tmp",
             "--remount-ro", "/", "--remount-ro", "/dev",  # only the capped /tmp is writable (bwrap's own are not capped)
             "--chdir", "/tmp", "--", python, "-I", "-S", "-B", "-c", BOOT]  # fmt: skip
    return argv


def _open_parents(path: str) -> list[str]:
    """bwrap arguments that create `path`'s parents traversable by all (bwrap would make them 0700 for root, and the
    harness runs as SANDBOX_UID then)."""
    return [arg for parent in reversed(Path(path).parents[:-1]) for arg in ("--perms", "0755", "--dir", str(parent))]


@functools.cache
def runner_code() -> bytes:
    """The harness's modules compiled once per process, marshalled as one tuple of code objects."""
    return marshal.dumps(tuple(compile(path.read_text(), str(path), "exec") for path in RUNNER))


def run(job: dict, limits: Limits, *, wall_s: float, sandbox: bool = True) -> RunResult:
    """Start the harness on `job` (harness.py's format; `limits` are added), read what it reports until it exits,
    `wall_s` passes, or it sends more than the caps allow; then kill everything it started. `sandbox=False` runs
    the harness without bubblewrap (reward.code.sandbox=none: the harness's own limits and filter still apply)."""
    read_end, write_end = os.pipe()
    # the harness forks the program's process (functions) or each case's (stdio), which installs the filter itself
    userns = root_user_namespace() if sandbox else None
    job = {**job, "limits": asdict(limits), "seccomp": seccomp_filter(), "events_fd": write_end,
           "uid": None if userns is None else SANDBOX_UID}  # fmt: skip
    stdin = _memfd(_boot_input(job))
    fds = tuple(fd for fd in (write_end, userns) if fd is not None)
    try:
        argv = bwrap_argv(limits, None, userns) if sandbox else [interpreter()[0], "-I", "-S", "-B", "-c", BOOT]
        proc = subprocess.Popen(argv, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=fds,
                                start_new_session=True, env={} if sandbox else _clean_env(), cwd="/")  # fmt: skip
    finally:
        for fd in (write_end, stdin):
            os.close(fd)
    start = time.monotonic()
    try:
        result = _read(proc, read_end, limits, start + wall_s)
        result.seconds = time.monotonic() - start
        return result
    finally:
        _kill(proc)
        os.close(read_end)


def _boot_input(job: dict) -> bytes:
    """What BOOT reads: marshal.dump of (the harness's code object, the job), as one stream."""
    return runner_code() + marshal.dumps(job)


def _memfd(data: bytes) -> int:
    """An anonymous file holding `data`, positioned at its start (a pipe could fill before the reader starts)."""
    fd = os.memfd_create("rlvr")
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _clean_env() -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"}


def _read(proc: subprocess.Popen, events_fd: int, limits: Limits, deadline: float) -> RunResult:
    """Read the events, stdout and stderr until all close or the deadline; caps as in the module docstring."""
    assert proc.stdout is not None and proc.stderr is not None
    result = RunResult()
    caps = {events_fd: MAX_EVENT_BYTES, proc.stdout.fileno(): limits.output_bytes, proc.stderr.fileno(): MAX_STDERR_BYTES}
    got: dict[int, list[bytes]] = {fd: [] for fd in caps}
    sizes = dict.fromkeys(caps, 0)
    with selectors.DefaultSelector() as selector:
        for fd in caps:
            os.set_blocking(fd, False)
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                result.timed_out = True
                break
            for key, _ in selector.select(left):
                fd = key.fd
                try:
                    data = os.read(fd, 1 << 16)
                except BlockingIOError:
                    continue
                if not data:
                    selector.unregister(fd)
                    continue
                got[fd].append(data)
                sizes[fd] += len(data)
                if sizes[fd] > caps[fd]:
                    result.output_cut = True
                    break
            if result.output_cut:
                break
    if result.timed_out or result.output_cut:
        _signal_group(proc)
    try:  # every pipe closed: it should be exiting; one that closed them and goes on is killed at the deadline
        result.exit_code = proc.wait(timeout=max(deadline - time.monotonic(), 0.0) + 0.1)
    except subprocess.TimeoutExpired:
        result.timed_out = True
        _signal_group(proc)
        result.exit_code = proc.wait()
    result.stderr = b"".join(got[proc.stderr.fileno()]).decode("utf-8", "replace")[:2000]
    result.events = _events(b"".join(got[events_fd])[:MAX_EVENT_BYTES])
    return result


def _events(data: bytes) -> list[list]:
    """Parse the event lines; a line that is not a JSON array (cut off, or written by the program) ends the list."""
    events = []
    for line in data.split(b"\n"):
        if not line:
            continue
        try:
            event = json.loads(line)
        except (ValueError, RecursionError):
            break
        if not isinstance(event, list) or not event or not isinstance(event[0], str):
            break
        events.append(event)
    return events


def _signal_group(proc: subprocess.Popen) -> None:
    """SIGKILL the sandbox's process group (bwrap's PID namespace takes every process inside along)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _kill(proc: subprocess.Popen) -> None:
    """Kill what is left of the sandbox, reap it, close its pipes."""
    if proc.returncode is None:
        _signal_group(proc)
        proc.wait()
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def check() -> None:
    """Start one trivial sandbox; SandboxError naming the package or the kernel setting when it cannot run."""
    try:
        result = run({"mode": "functions", "program": "x = 1", "setup": "", "tests": ["__rlvr_value__(0, x)"]},
                     Limits(), wall_s=30.0)  # fmt: skip
    except OSError as e:
        raise SandboxError(f"bubblewrap could not be started: {e}. {INSTALL}") from None
    if ["value", 0, 0, ["i", "1"]] in result.events:
        return
    said = result.stderr.strip() or f"exit code {result.exit_code}, events {result.events}"
    hint = USERNS if any(w in said for w in ("namespace", "Operation not permitted", "uid map", "setting up")) else INSTALL
    raise SandboxError(f"the code sandbox does not work here: bwrap said: {said[:500]}. {hint}")
