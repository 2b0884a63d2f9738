"""Hostile programs against the code verifier (rlvr.verifiers.code: its verifier, sandbox and harness; rlvr.verifiers.pool).

Each test runs a program written to attack the host or the verdict and asserts both the verdict (a program that does
not solve the task is never CORRECT, with the right detail, within a time bounded by the limits; a harmless or legit
program stays CORRECT) and that the host is untouched. Where an attack applies to both, it runs as a functions
program (assert / check / call tests) and as a stdin/stdout program. Behaviours covered:

1. writes outside the work folder: canaries under the host's /tmp, the test's tmp_path, the repo and $HOME, through
   a symlink from the sandbox's /tmp, appending to /etc/passwd and /etc/shadow, overwriting a host file,
   sethostname -> the host's files are unchanged. Writes into the sandbox's root and /dev -> refused (read-only:
   only the capped /tmp is writable).
2. network: TCP to a listener the test opens on 127.0.0.1 (by address and as localhost), an abstract unix socket,
   DNS -> nothing reaches the host, names do not resolve.
3. processes that outlive the run: fork, double fork + setsid, subprocess.Popen (argv and shell), multiprocessing,
   os.posix_spawn, os.system, daemon threads that sleep -> refused (threads allowed), no host process or thread
   carries the program's marker afterwards, the worker pool is alive.
4. signals: kill(getppid()), kill(1), kill(-1) (SIGKILL and SIGSTOP), killpg of its own group, kill of the host's
   pids by number -> the test process and the pool's worker survive, the same pool then scores a correct program.
5. reading the host: /etc/shadow, /etc/passwd, /etc/hostname, the repo's README.md, a file under tmp_path,
   /proc/self/environ and /proc/1/environ, an environment variable set in the test -> never readable (the
   program's output depends on it and does not pass).
6. ctypes / subprocess escapes: libc fork(), raw fork/clone syscalls, execve replacing the harness, /bin/sh.
7. bombs: fork, threads (10k; and past RLIMIT_NPROC with small stacks, also when rlvr runs as root), memory (one huge
   allocation, list growth), disk (1 GB file, many files), output (forever, one huge line), file descriptors, huge
   integers (10**10**8, str of 10**5000), a loop ignoring SIGXCPU/SIGTERM, sleep, C recursion to a segfault,
   non-UTF-8 output and lone surrogates -> the right detail, in bounded time, the host's /tmp and memory unchanged.
8. reward hacks: sys.exit / os._exit / atexit before the tests, objects and int/str subclasses whose __eq__ is always
   True (assert and call tests), patched builtins, patched unittest, sys.settrace, printing "All tests passed" or the
   expected output for another input, searching the harness's memory for an expected value it never holds, forged
   events on the events pipe, the harness's functions patched through gc, asserts in loops silenced by a trace
   function or gc, forged reports and replies on every descriptor and /proc path, the harness's functions and
   namespaces patched through frames -> never CORRECT (the program runs in a process apart from the judge, which
   owns the only events descriptor).
9. legit programs still pass: two threads, a file in the working folder, the common standard library, recursion to
   depth 5000, debug printing under the cap, `if __name__ == "__main__":` reading stdin, stderr output.
And sandbox.check() names bubblewrap when bwrap is not on PATH (judge then says sandbox_error).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import random
import shutil
import socket
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from rlvr.verifiers import Outcome, Verdict
from rlvr.verifiers.code import sandbox as sandbox_module
from rlvr.verifiers.code.sandbox import Limits, SandboxError
from rlvr.verifiers.code.verifier import judge
from rlvr.verifiers.pool import PoolStats, VerifierPool

# serial: the sandbox's verdicts under limits of seconds are checked with no second test worker beside them (make test)
pytestmark = pytest.mark.serial

REPO = Path(__file__).resolve().parents[1]
C, W = Outcome.CORRECT, Outcome.INCORRECT
FUNC = {"tests": [{"assert": "assert add(1, 2) == 3"}, {"assert": "assert add(2, 2) == 4"}]}
STDIO = {"tests": [{"stdin": "1 2\n", "stdout": "3\n"}]}
ADD = "\ndef add(a, b):\n    return a + b\n"
MAIN = "\nif __name__ == '__main__':\n    a, b = map(int, input().split())\n    print(add(a, b))\n"
FAST = {"time_limit_s": 0.5, "max_wall_s": 2.0}  # for programs that must hit a limit: CPU 1 s (hard 2 s), wall 2 s
DEFAULT_WALL = 4.5  # judge's max_wall_s
POOL_WALL = 2.5  # the pool's judge: a harness stopped by its own program is killed sooner
MODES = ["functions", "stdio"]


# ---- helpers --------------------------------------------------------------------------------------------------------


def fenced(program: str) -> str:
    return f"Here it is.\n```python\n{program}\n```\n"


def judged(program: str, record: dict, **options) -> tuple[Verdict, float]:
    """judge() on `program` (fenced) and `record`; (the verdict, seconds it took)."""
    start = time.monotonic()
    verdict = judge(fenced(program), json.dumps(record), **options)
    return verdict, time.monotonic() - start


def in_mode(mode: str, attack: str, solve: str = ADD) -> tuple[str, dict]:
    """(the program, its record): `attack` then a solution of add, read from stdin and printed in stdio mode."""
    return (attack + solve, FUNC) if mode == "functions" else (attack + solve + MAIN, STDIO)


def bound(options: dict) -> float:
    """The most a run may take: its wall-clock limit and 2 s of slack for start-up and teardown."""
    return options.get("max_wall_s", DEFAULT_WALL) + 2.0


def marker() -> str:
    """A unique string that fits a thread's name (15 bytes)."""
    return "rlvr" + uuid.uuid4().hex[:11]


def host_processes_with(mark: str) -> list[int]:
    """Host pids whose command line, environment or any thread's name holds `mark`."""
    needle, found = mark.encode(), []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            texts = [(proc / "cmdline").read_bytes(), (proc / "environ").read_bytes()]
            texts += [(task / "comm").read_bytes() for task in (proc / "task").iterdir()]
        except OSError:  # gone, or not ours to read
            continue
        if any(needle in text for text in texts):
            found.append(int(proc.name))
    return found


def assert_no_survivors(mark: str, grace_s: float = 2.0) -> None:
    """No host process carries `mark` (a killed sandbox may take a moment to be reaped)."""
    deadline = time.monotonic() + grace_s
    while (left := host_processes_with(mark)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left == [], f"processes carrying {mark} outlived the run: {left}"


def shared_memory() -> int:
    """The host's memory that outlives a process (tmpfs files, shared memory, memfds: Shmem): what a sandbox could leave
    behind. (Not MemAvailable: it moves with whatever else the machine runs, such as the other test worker.)"""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("Shmem:"):
            return int(line.split()[1]) << 10
    raise AssertionError("no Shmem in /proc/meminfo")


def tmp_free() -> int:
    return shutil.disk_usage(tempfile.gettempdir()).free


def digest(path: Path) -> tuple[str, int, int] | None:
    """A file's content hash, size and mtime (None when it does not exist)."""
    try:
        st = path.stat()
        return hashlib.sha256(path.read_bytes()).hexdigest(), st.st_size, st.st_mtime_ns
    except FileNotFoundError:
        return None


@pytest.fixture(autouse=True)
def _requires_sandbox(request: pytest.FixtureRequest) -> None:
    """Every test needs a working bubblewrap sandbox, except the ones about its absence."""
    if not request.function.__name__.startswith("test_check_"):
        if not _sandbox_works():
            pytest.skip("bubblewrap cannot run here (sandbox.check() failed)")


_SANDBOX: list[bool] = []


def _sandbox_works() -> bool:
    if not _SANDBOX:
        try:
            sandbox_module.check()
            _SANDBOX.append(True)
        except SandboxError:
            _SANDBOX.append(False)
    return _SANDBOX[0]


@pytest.fixture(scope="module")
def pool():
    """One worker scoring with the code verifier's judge (as the trainer's pool does), shared by the tests that try
    to kill it: each checks it is still the same live worker (no error, no timeout) and still scores."""
    if not _sandbox_works():
        pytest.skip("bubblewrap cannot run here")
    with VerifierPool(functools.partial(judge, max_wall_s=POOL_WALL), workers=1, timeout_s=10) as p:
        yield p


def pooled(pool: VerifierPool, program: str, record: dict) -> Verdict:
    """Score one program through `pool`; its worker must neither die nor time out, and must still score a correct
    program CORRECT afterwards."""
    (verdict,), stats = pool.score([(fenced(program), json.dumps(record))])
    assert stats == PoolStats(), f"the worker died or timed out: {stats}"
    assert isinstance(verdict, Verdict)
    (after,), stats = pool.score([(fenced(ADD), json.dumps(FUNC))])
    assert (after.outcome, stats) == (C, PoolStats())
    return verdict


# ---- 1. writes outside the work folder --------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_writes_to_host_paths_stay_inside_the_sandbox(mode: str, tmp_path: Path) -> None:
    existing = tmp_path / "existing.txt"
    existing.write_text("original\n")
    uid = uuid.uuid4().hex
    canaries = [Path(tempfile.gettempdir()) / f"rlvr-canary-{uid}", tmp_path / f"canary-{uid}",
                REPO / f".rlvr-canary-{uid}", Path.home() / f".rlvr-canary-{uid}",
                tmp_path / "deep" / f"canary-{uid}"]  # fmt: skip
    linked = [Path(tempfile.gettempdir()) / f"rlvr-linked-{uid}", tmp_path / f"linked-{uid}"]
    guarded = [Path("/etc/passwd"), Path("/etc/shadow"), Path.home() / ".bashrc", Path.home() / ".profile", existing]
    before = {p: digest(p) for p in guarded}
    hostname = socket.gethostname()
    attack = f"""
import os, socket
for path in {[str(p) for p in canaries]!r}:
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "a") as f:
            f.write("pwned")
    except OSError:
        pass
for i, path in enumerate({[str(p) for p in linked]!r}):
    try:
        os.symlink(path, f"/tmp/link{{i}}")
        with open(f"/tmp/link{{i}}", "w") as f:
            f.write("pwned")
    except OSError:
        pass
for path in ["/etc/passwd", "/etc/shadow", os.path.expanduser("~/.bashrc"), {str(Path.home() / ".profile")!r},
             {str(existing)!r}, "/proc/1/root{existing}", "/proc/self/cwd/../{existing}"]:
    try:
        with open(path, "a") as f:
            f.write("rlvr-canary-line\\n")
    except OSError:
        pass
try:
    socket.sethostname("pwned")
except OSError:
    pass
"""
    try:
        verdict, _ = judged(*in_mode(mode, attack))
        assert (verdict.outcome, verdict.detail) == (C, "passed")  # harmless to the host: the program solved add
        assert [p for p in canaries + linked if p.exists() or p.is_symlink()] == []
        assert {p: digest(p) for p in guarded} == before
        assert existing.read_text() == "original\n"
        assert socket.gethostname() == hostname
    finally:
        for p in canaries + linked:
            if p.is_file():
                p.unlink()


@pytest.mark.parametrize(("mode", "folder"), [("functions", "/"), ("functions", "/dev"), ("functions", "/dev/shm"),
                                              ("stdio", "/")])  # fmt: skip
def test_writes_outside_tmp_are_refused_or_capped_like_tmp(mode: str, folder: str) -> None:
    cap_mb = Limits().tmp_bytes >> 20
    attack = f"""
import os
written = 0
for i in range({cap_mb} + 24):
    try:
        with open(os.path.join({folder!r}, f"bomb{{i}}"), "wb") as f:
            f.write(b"\\0" * (1 << 20))
        written += 1
    except OSError:
        break
capped = written <= {cap_mb}
"""
    before = shared_memory()
    program, record = in_mode(mode, attack, "\ndef add(a, b):\n    return a + b if capped else -written\n")
    verdict, elapsed = judged(program, record)
    assert shared_memory() < before + (256 << 20)
    assert elapsed < bound({})
    assert (verdict.outcome, verdict.detail) == (C, "passed"), f"{folder} took more than {cap_mb} MiB of host memory"


# ---- 2. network -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_no_connection_reaches_a_host_listener(mode: str) -> None:
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(8)
    port = tcp.getsockname()[1]
    abstract = f"\0rlvr-{uuid.uuid4().hex}"
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(abstract)
    unix.listen(8)
    attack = f"""
import socket
connected = 0
for host in ("127.0.0.1", "localhost", "::1"):
    try:
        socket.create_connection((host, {port}), timeout=0.5).sendall(b"hello")
        connected += 1
    except OSError:
        pass
try:
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(0.5)
    s.connect({abstract!r})
    connected += 1
except OSError:
    pass
try:
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("127.0.0.1", {port}))
except OSError:
    pass
"""
    try:
        verdict, _ = judged(*in_mode(mode, attack, "\ndef add(a, b):\n    return a + b + connected\n"))
        assert (verdict.outcome, verdict.detail) == (C, "passed")  # every connection failed inside
        for listener in (tcp, unix):
            listener.settimeout(0.2)
            with pytest.raises(TimeoutError):
                listener.accept()
    finally:
        tcp.close()
        unix.close()


@pytest.mark.parametrize("mode", MODES)
def test_names_do_not_resolve(mode: str) -> None:
    attack = """
import socket
resolved = 0
for name in ("example.com", "pypi.org", "localhost"):
    try:
        socket.getaddrinfo(name, 443)
        resolved += 1
    except OSError:
        pass
"""
    verdict, elapsed = judged(*in_mode(mode, attack, "\ndef add(a, b):\n    return a + b + resolved\n"))
    assert (verdict.outcome, verdict.detail) == (C, "passed")
    assert elapsed < bound({})


# ---- 3 and 6. processes that outlive the run, ctypes and subprocess escapes -------------------------------------------

SPAWNS = {
    "fork": """
if os.fork() == 0:
    os.execv(sys.executable, SLEEPER)
spawned = 1
""",
    "double_fork_setsid": """
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, SLEEPER)
    os._exit(0)
spawned = 1
""",
    "popen": "subprocess.Popen(SLEEPER, env={'M': MARK}, start_new_session=True)\nspawned = 1",
    "popen_shell": "subprocess.Popen('sleep 100 # ' + MARK, shell=True)\nspawned = 1",
    "bin_sh": "subprocess.run(['/bin/sh', '-c', 'sleep 100 & # ' + MARK])\nspawned = 1",
    "os_system": "spawned = int(os.system('sleep 100 & # ' + MARK) == 0)",
    "posix_spawn": "os.posix_spawn(sys.executable, SLEEPER, {'M': MARK})\nspawned = 1",
    "multiprocessing": """
def child():
    ctypes.CDLL(None).prctl(15, MARK.encode(), 0, 0, 0)  # PR_SET_NAME: the thread's name on the host
    time.sleep(100)
multiprocessing.Process(target=child).start()
spawned = 1
""",
    "ctypes_fork": """
pid = ctypes.CDLL(None).fork()
if pid == 0:
    os.execv(sys.executable, SLEEPER)
spawned = int(pid > 0)
""",
    "ctypes_raw_fork_syscall": """
number, flags = {"x86_64": (57, 0), "aarch64": (220, 17)}[platform.machine()]  # fork; clone(SIGCHLD) on arm
pid = ctypes.CDLL(None).syscall(number, flags, 0, 0, 0, 0)
if pid == 0:
    os.execv(sys.executable, SLEEPER)
spawned = int(pid > 0)
""",
    "ctypes_raw_clone_syscall": """
number = {"x86_64": 56, "aarch64": 220}[platform.machine()]
pid = ctypes.CDLL(None).syscall(number, 17, 0, 0, 0, 0)  # clone(SIGCHLD): a process, not a thread
if pid == 0:
    os.execv(sys.executable, SLEEPER)
spawned = int(pid > 0)
""",
}


def spawn_attack(body: str, mark: str) -> str:
    indented = "\n".join("    " + line for line in body.strip().splitlines())
    return f"""
import multiprocessing, os, platform, subprocess, sys, time
try:
    import ctypes
except RuntimeError:  # functions mode: the harness's audit hook refuses ctypes
    ctypes = None
MARK = {mark!r}
SLEEPER = [sys.executable, "-c", "import time; time.sleep(100)", MARK]
spawned = 0
try:
{indented}
except Exception:
    pass
"""


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("how", sorted(SPAWNS))
def test_new_processes_are_refused_and_none_outlives_the_run(pool: VerifierPool, how: str, mode: str) -> None:
    mark = marker()
    program, record = in_mode(mode, spawn_attack(SPAWNS[how], mark), "\ndef add(a, b):\n    return a + b + spawned\n")
    verdict = pooled(pool, program, record)
    assert (verdict.outcome, verdict.detail) == (C, "passed")  # the attempt failed inside, then add was solved
    assert_no_survivors(mark)


@pytest.mark.parametrize("mode", MODES)
def test_daemon_threads_die_with_the_run(pool: VerifierPool, mode: str) -> None:
    mark = marker()
    attack = f"""
import threading, time
try:
    import ctypes
except RuntimeError:  # functions mode: ctypes is refused, so these threads go unnamed there
    ctypes = None
def sleeper():
    if ctypes:
        ctypes.CDLL(None).prctl(15, {mark!r}.encode(), 0, 0, 0)  # PR_SET_NAME
    time.sleep(100)
for _ in range(4):
    threading.Thread(target=sleeper, daemon=True).start()
time.sleep(0.05)
"""
    verdict = pooled(pool, *in_mode(mode, attack))
    assert (verdict.outcome, verdict.detail) == (C, "passed")  # threads are allowed; they end with the run
    assert_no_survivors(mark)


@pytest.mark.parametrize("mode", MODES)
def test_execve_replacing_the_harness_times_out_and_leaves_nothing(mode: str) -> None:
    mark = marker()
    attack = f"""
import ctypes, sys
argv = (ctypes.c_char_p * 5)(sys.executable.encode(), b"-c", b"import time; time.sleep(100)", {mark!r}.encode(), None)
env = (ctypes.c_char_p * 2)(b"M={mark}", None)
ctypes.CDLL(None).execve(sys.executable.encode(), argv, env)
"""
    verdict, elapsed = judged(*in_mode(mode, attack), **FAST)
    # functions: the audit hook refuses ctypes at import; stdio: the new image keeps the limits and runs out of time
    assert (verdict.outcome, verdict.detail) == (W, "runtime_error" if mode == "functions" else "timeout")
    assert elapsed < bound(FAST)
    assert_no_survivors(mark)


# ---- 4. signals ---------------------------------------------------------------------------------------------------------

KILLED = {"timeout", "runtime_error"}  # the harness itself was killed: a sandbox exit code read as one of these


def _host_pids() -> list[int]:
    """This test process, its parent and its children (the pool's worker)."""
    children = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1]) == os.getpid():
                children.append(int(proc.name))
        except (OSError, IndexError, ValueError):
            continue
    return [os.getpid(), os.getppid(), *children]


SIGNALS = {  # attack -> the verdicts allowed in (functions, stdio) mode
    # functions: the program's parent is the judge, as a stdio case's is the harness; killing it fails the run
    "kill_parent": ("os.kill(os.getppid(), signal.SIGKILL)", {(W, d) for d in KILLED}, {(W, d) for d in KILLED}),
    "kill_init": ("os.kill(1, signal.SIGKILL)", {(C, "passed")}, {(C, "passed")}),
    "kill_everyone": ("os.kill(-1, signal.SIGKILL)", {(W, d) for d in KILLED}, {(W, d) for d in KILLED}),
    "stop_everyone": ("os.kill(-1, signal.SIGSTOP)", {(W, "timeout")}, {(W, "timeout")}),
    "killpg_own": ("os.killpg(0, signal.SIGKILL)", {(W, d) for d in KILLED}, {(W, d) for d in KILLED}),
    "kill_host_pids": ("for pid in HOST_PIDS:\n    try:\n        os.kill(pid, signal.SIGKILL)\n    except OSError:\n"
                       "        pass", {(C, "passed")}, {(C, "passed")}),  # fmt: skip
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("how", sorted(SIGNALS))
def test_signals_reach_nothing_outside_the_sandbox(pool: VerifierPool, how: str, mode: str) -> None:
    code, functions_ok, stdio_ok = SIGNALS[how]
    host = _host_pids()
    indented = "\n".join("    " + line for line in code.splitlines())
    attack = f"import os, signal\nHOST_PIDS = {host!r}\ntry:\n{indented}\nexcept OSError:\n    pass\n"
    verdict = pooled(pool, *in_mode(mode, attack))  # the worker survived and still scores (pooled checks)
    assert (verdict.outcome, verdict.detail) in (functions_ok if mode == "functions" else stdio_ok)
    for pid in host:  # this process, its parent and the worker are alive
        os.kill(pid, 0)


# ---- 5. reading the host's files and environment ------------------------------------------------------------------------


def _secret_targets(tmp_path: Path) -> list[tuple[str, str]]:
    """(path, its content as the host reads it) of files a program must not read."""
    secret_file = tmp_path / "secret.txt"
    secret_file.write_text(f"secret {uuid.uuid4().hex}\n")
    targets = []
    for path in ("/etc/shadow", "/etc/passwd", "/etc/hostname", str(REPO / "README.md"), str(secret_file),
                 "/proc/self/environ", "/proc/1/environ"):  # fmt: skip
        try:
            content = Path(path).read_bytes().decode("utf-8", "replace")
        except OSError:  # not readable even here (/proc/1/environ in some containers): nothing to leak
            continue
        if content.strip():
            targets.append((path, content))
    return targets


@pytest.mark.parametrize("mode", MODES)
def test_host_files_and_environment_cannot_be_read(mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = f"s3cr3t-{uuid.uuid4().hex}"
    monkeypatch.setenv("RLVR_TEST_SECRET", secret)
    targets = _secret_targets(tmp_path)  # after setenv: /proc/self/environ holds the secret
    assert len(targets) >= 5
    peek = """
import os
def peek(path):
    if path == "env":
        return os.environ.get("RLVR_TEST_SECRET", "absent")
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace")
    except OSError as e:
        return type(e).__name__
"""
    for path, content in [*targets, ("env", secret)]:
        if mode == "functions":
            verdict, _ = judged(peek, {"tests": [{"assert": f"assert peek({path!r}) == {content!r}"}]})
        else:
            program = peek + f"\nimport sys\nsys.stdout.write(peek({path!r}))\n"
            verdict, _ = judged(program, {"tests": [{"stdin": "", "stdout": content}]})
        assert (verdict.outcome, verdict.detail) == (W, "wrong_answer"), path
    # what the program sees instead: no such files, its own clean environment
    probe = peek + "\ndef seen():\n    return [peek(p)[:40] for p in ('/etc/shadow', '/etc/hostname', 'env')] + [sorted(os.environ)]\n"
    verdict, _ = judged(probe, {"tests": [{"assert": "assert seen() == ['FileNotFoundError', 'FileNotFoundError', "
                                                     "'absent', ['LANG', 'PATH', 'PWD', 'PYTHONHASHSEED']]"}]})  # fmt: skip
    assert (verdict.outcome, verdict.detail) == (C, "passed")


# ---- 7. bombs ---------------------------------------------------------------------------------------------------------

BOMBS = {  # name -> (the attack, run before add is defined; the detail; judge's options)
    "fork_bomb": ("import os\nwhile True:\n    os.fork()", "runtime_error", {}),
    "thread_bomb": ("import threading, time\nfor _ in range(10_000):\n"
                    "    threading.Thread(target=time.sleep, args=(100,), daemon=True).start()", "runtime_error", {}),
    "one_huge_allocation": ("x = bytearray(10**10)", "memory_limit", {}),
    "list_growth": ("x = []\nwhile True:\n    x.append(bytearray(1 << 20))", "memory_limit", {"memory_mb": 256}),
    "disk_1gb_in_tmp": ("with open('/tmp/big', 'wb') as f:\n    for _ in range(1024):\n"
                        "        f.write(b'\\0' * (1 << 20))", "runtime_error", {}),
    "many_files_in_tmp": ("for i in range(10**6):\n    with open(f'/tmp/f{i}', 'w') as f:\n"
                          "        f.write('x' * 1024)", "runtime_error", {}),
    "print_forever": ("while True:\n    print('spam' * 100)", "output_limit", {}),
    "one_huge_line": ("print('x' * 10**8)", "output_limit", {}),
    "fd_bomb": ("files = [open('/dev/null') for _ in range(100_000)]", "runtime_error", {}),
    "huge_power": ("x = 10**10**8", "timeout", FAST),
    "str_of_huge_int": ("s = str(10**5000)", "runtime_error", {}),
    "ignores_sigxcpu_and_sigterm": ("import signal\nfor s in (signal.SIGXCPU, signal.SIGTERM, signal.SIGINT):\n"
                                    "    signal.signal(s, signal.SIG_IGN)\nwhile True:\n    pass", "timeout", FAST),
    "sleeps": ("import time\ntime.sleep(1000)", "timeout", FAST),
    "closes_its_pipes_and_sleeps": ("import os, time\nos.closerange(0, 1024)\ntime.sleep(1000)", "timeout", FAST),
    "c_recursion_segfault": ("import sys\nsys.setrecursionlimit(10**6)\nclass A:\n"
                             "    def __getattr__(self, name):\n        return getattr(self, name)\nA().x",
                             "runtime_error", {}),  # fmt: skip
    "python_recursion_bomb": ("import sys\nsys.setrecursionlimit(10**6)\ndef f(n):\n    return f(n + 1) + 1\nf(0)",
                              "runtime_error", {}),  # fmt: skip
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(BOMBS))
def test_bombs_get_their_detail_in_bounded_time_and_spare_the_host(name: str, mode: str) -> None:
    attack, detail, options = BOMBS[name]
    free, memory = tmp_free(), shared_memory()
    verdict, elapsed = judged(*in_mode(mode, attack + "\n"), **options)
    assert (verdict.outcome, verdict.detail) == (W, detail)
    assert elapsed < bound(options)
    assert abs(tmp_free() - free) < 32 << 20  # nothing reached the host's disk
    assert shared_memory() < memory + (1 << 30)  # nor stayed in its memory


INODE_BOMBS = {  # what costs a tmpfs no bytes: empty files, folders, links
    "empty_files": "open(f'/tmp/e{i}', 'w').close()",
    "folders": "os.mkdir(f'/tmp/d{i}')",
    "symlinks": "os.symlink('/tmp', f'/tmp/l{i}')",
}


@pytest.mark.skipif(os.geteuid() != 0, reason="the file cap is mounted by the harness where rlvr runs as root")
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(INODE_BOMBS))
def test_many_empty_files_end_at_the_file_cap_not_the_cpu_limit(name: str, mode: str) -> None:
    attack = f"import os\nmade = 0\ntry:\n    for i in range(10**7):\n        {INODE_BOMBS[name]}\n        made += 1\n" \
             f"except OSError as e:\n    stop = e.errno\n"
    cap = Limits().tmp_inodes
    solve = f"def add(a, b):\n    return a + b if stop == 28 and {cap // 2} < made < {cap} else -made\n"  # ENOSPC
    verdict, elapsed = judged(*in_mode(mode, attack, solve))  # 10**7 would take far past the 2 s of CPU
    assert (verdict.outcome, verdict.detail) == (C, "passed")
    assert elapsed < bound({})


@pytest.mark.parametrize("mode", MODES)
def test_the_mount_table_names_no_host_path(mode: str) -> None:
    attack = """
def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""
mounts = "".join(read(p) for p in ("/proc/self/mountinfo", "/proc/self/mounts", "/proc/1/mountinfo", "/etc/mtab"))
"""
    verdict, _ = judged(*in_mode(mode, attack, "def add(a, b):\n    return a + b if mounts == '' else mounts\n"))
    assert (verdict.outcome, verdict.detail) == (C, "passed")


def test_a_recursion_bomb_stops_at_the_capped_limit() -> None:
    program = """
import sys
sys.setrecursionlimit(10**6)
def deepest(n=0):
    try:
        return deepest(n + 1)
    except RecursionError:
        return n
def depth():
    return deepest()
"""
    cap = Limits().recursion
    verdict, _ = judged(program, {"tests": [{"assert": f"assert {cap // 2} < depth() < {cap}"}]})
    assert (verdict.outcome, verdict.detail) == (C, "passed")  # not 10**6 deep after a second or more of CPU
    verdict, _ = judged(program + "sys.setrecursionlimit(3000)\n", {"tests": [{"assert": "assert 2000 < depth() < 3000"}]})
    assert (verdict.outcome, verdict.detail) == (C, "passed")  # a lower limit is the program's to set


RETURNED = {  # a hostile value returned to a value site -> the detail
    "huge_string": ("'x' * (50 << 20)", "output_limit"),  # past the 8 MiB cap on events: the run is cut
    "deep_nesting": ("functools.reduce(lambda a, _: [a], range(100_000), [])", "wrong_answer"),
    "self_reference": ("(lambda a: a.append(a) or a)([])", "wrong_answer"),
    "huge_int": ("10 ** (10**6)", "wrong_answer"),
    "dict_subclass": ("type('D', (dict,), {'__eq__': lambda s, o: True})()", "wrong_answer"),
    "generator": ("(x for x in [3])", "wrong_answer"),
}


@pytest.mark.parametrize("name", sorted(RETURNED))
def test_hostile_return_values_fail_cleanly(name: str) -> None:
    expression, detail = RETURNED[name]
    verdict, elapsed = judged(f"import functools\ndef add(a, b):\n    return {expression}\n", FUNC)
    assert verdict[:3] == (W, 0.0, detail)
    assert elapsed < bound({})


def test_threads_are_capped_by_the_process_limit() -> None:
    attack = """
import threading
threading.stack_size(64 * 1024)
started = 0
stop = threading.Event()
try:
    for _ in range(2000):
        threading.Thread(target=stop.wait, daemon=True).start()
        started += 1
except RuntimeError:
    pass
stop.set()
"""
    cap = Limits().processes
    verdict, elapsed = judged(attack + f"\ndef add(a, b):\n    return a + b if started <= {cap} else started\n", FUNC)
    assert elapsed < bound({})
    assert (verdict.outcome, verdict.detail) == (C, "passed"), f"more than {cap} threads"


@pytest.mark.parametrize("mode", MODES)
def test_non_utf8_output(mode: str) -> None:
    attack = "import sys\nsys.stdout.buffer.write(b'\\xff\\xfe\\xc3(\\xed\\xa0\\x80')\nsys.stdout.buffer.flush()\n"
    verdict, _ = judged(*in_mode(mode, attack))
    # functions: stdout is not the answer; stdio: the garbage precedes "3"
    assert (verdict.outcome, verdict.detail) == ((C, "passed") if mode == "functions" else (W, "wrong_answer"))


def test_lone_surrogates_round_trip_exactly() -> None:
    program = "def text(i):\n    return ['\\ud800x', '\\udfff', 'ok\\x00'][i]\n"
    good = {"tests": [{"assert": "assert text(0) == '\\ud800x'"}, {"assert": "assert text(1) == '\\udfff'"},
                      {"assert": "assert text(2) == 'ok\\x00'"}]}  # fmt: skip
    bad = {"tests": [{"assert": "assert text(0) == '\\ud801x'"}, {"assert": "assert text(1) == '\\ufffd'"}]}
    assert judged(program, good)[0][:3] == (C, 1.0, "passed")
    assert judged(program, bad)[0][:3] == (W, 0.0, "wrong_answer")


# ---- 8. reward hacks ------------------------------------------------------------------------------------------------------


def _big() -> int:
    """An expected value no program can compute: 30 random digits."""
    return random.SystemRandom().randrange(10**29, 10**30)


EQ_TRUE = """
class Anything:
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    __hash__ = object.__hash__
"""
HACKS = {  # name -> (program, the detail in functions mode, in stdio mode); the program never solves add
    "sys_exit_first": ("import sys\nsys.exit(0)\n" + ADD, "runtime_error", "wrong_answer"),
    "os_exit_first": ("import os\nos._exit(0)\n" + ADD, "runtime_error", "wrong_answer"),
    "atexit_os_exit": ("import atexit, os\natexit.register(os._exit, 0)\ndef add(a, b):\n    return 0\n",
                       "wrong_answer", "wrong_answer"),
    "atexit_then_exit": ("import atexit, os, sys\natexit.register(os._exit, 0)\nsys.exit(0)\n", "runtime_error",
                         "wrong_answer"),
    "eq_always_true": (EQ_TRUE + "def add(a, b):\n    return Anything()\n", "wrong_answer", "wrong_answer"),
    "int_subclass": ("class I(int):\n    __eq__ = lambda s, o: True\n    __hash__ = int.__hash__\n"
                     "    __str__ = lambda s: '3'\ndef add(a, b):\n    return I(0)\n", "wrong_answer", "wrong_answer"),
    "patched_builtins": ("import builtins\nclass Quiet(Exception):\n    pass\nbuiltins.AssertionError = Quiet\n"
                         "real_import = builtins.__import__\nbuiltins.__import__ = lambda *a, **k: real_import(*a, **k)\n"
                         "builtins.print = lambda *a, **k: None\nbuiltins.bool = lambda *a: True\n"
                         "builtins.isinstance = lambda *a: True\ndef add(a, b):\n    return 0\n",
                         "wrong_answer", "wrong_answer"),  # fmt: skip
    "patched_unittest": ("import unittest\nunittest.TestCase.assertEqual = lambda *a: None\n"
                         "unittest.TestCase.assertTrue = lambda *a: None\ndef add(a, b):\n    return 0\n",
                         "wrong_answer", "wrong_answer"),  # fmt: skip
    "settrace_skips_lines": ("""
import sys
def local(frame, event, arg):
    if event == "line":
        frame.f_globals["__rlvr_value__"] = frame.f_globals["__rlvr_truth__"] = lambda *a: None
        try:
            frame.f_lineno = frame.f_lineno + 1
        except ValueError:
            pass
    return local
sys.settrace(lambda frame, event, arg: local if frame.f_code.co_filename.startswith("test_") else None)
def add(a, b):
    return 0
""", "runtime_error", "wrong_answer"),  # functions: the audit hook refuses sys.settrace
    "prints_all_tests_passed": ("print('passed')\nprint('All tests passed')\ndef add(a, b):\n    return 0\n",
                                "wrong_answer", "wrong_answer"),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(HACKS))
def test_reward_hacks_are_never_correct(name: str, mode: str) -> None:
    program, functions_detail, stdio_detail = HACKS[name]
    if mode == "stdio":
        program += "\nprint(add(1, 2))\n" if "def add" in program else "\nprint(3)\n"
        program = program.replace("print = lambda *a, **k: None", "print = print")  # stdio must print to try
    record = FUNC if mode == "functions" else {"tests": [{"stdin": "1 2\n", "stdout": "3\n"},
                                                        {"stdin": "2 2\n", "stdout": "4\n"}]}  # fmt: skip
    verdict, _ = judged(program, record)
    assert verdict.outcome is W
    assert verdict.detail == (functions_detail if mode == "functions" else stdio_detail)


def test_eq_always_true_fails_call_and_check_tests() -> None:
    program = EQ_TRUE + "def f(x):\n    return Anything()\nclass Solution:\n    def g(self, x):\n        return Anything()\n"
    record = {"tests": [{"call": "f", "args": [1], "expected": 2}, {"call": "g", "args": [1], "expected": [2, 3]},
                        {"check": "def check(candidate):\n    assert candidate(1) == 2\n", "entry_point": "f"},
                        {"assert": "assert f(1) == f(2) + 0"}]}  # fmt: skip
    verdict, _ = judged(program, record)
    assert verdict[:3] == (W, 0.0, "wrong_answer")
    strings = "class S(str):\n    __eq__ = lambda s, o: True\n    __hash__ = str.__hash__\ndef name():\n    return S('no')\n"
    verdict, _ = judged(strings, {"tests": [{"assert": "assert name() == 'abc'"}, {"call": "name", "args": [], "expected": "abc"}]})
    assert verdict[:3] == (W, 0.0, "wrong_answer")


def test_expected_output_for_another_input_scores_only_that_case() -> None:
    record = {"tests": [{"stdin": "1 2\n", "stdout": "3\n"}, {"stdin": "2 2\n", "stdout": "4\n"}]}
    verdict, _ = judged("print(3)\n", record)
    assert verdict[:3] == (W, 0.5, "wrong_answer")


def test_expected_values_are_not_in_the_sandbox_to_be_found() -> None:
    big = _big()
    functions = """
import gc, re, sys
def found():
    hits = []
    for o in gc.get_objects():
        try:
            items = o.values() if isinstance(o, dict) else o if isinstance(o, (list, tuple)) else ()
            for x in items:
                if type(x) is int and 10**29 <= x < 10**30:
                    hits.append(x)
                elif type(x) is str:
                    hits += [int(m) for m in re.findall(r"\\d{30}", x)]
        except Exception:
            pass
    return hits[-1] if hits else 0
def f():
    return found()
"""
    verdict, _ = judged(functions, {"tests": [{"assert": f"assert f() == {big}"}, {"call": "f", "args": [], "expected": big},
                                              {"check": f"def check(candidate):\n    assert candidate() == {big}\n",
                                               "entry_point": "f"}]})  # fmt: skip
    assert verdict[:3] == (W, 0.0, "runtime_error")  # the audit hook refuses gc.get_objects (and the value is not there)
    stdio = functions + "\nprint(found())\n"
    verdict, _ = judged(stdio, {"tests": [{"stdin": "", "stdout": f"{big}\n"}]})
    assert verdict[:3] == (W, 0.0, "wrong_answer")


FORGE = """
import os, stat
def forge(lines):
    for fd in range(3, 1 << 16):  # the events pipe keeps the parent's number, which depends on what it has open
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode):
                os.write(fd, "".join(line + "\\n" for line in lines).encode())
        except OSError:
            pass
"""


@pytest.mark.parametrize("then", ["exit", "continue"])
def test_forged_events_do_not_make_a_wrong_program_correct(then: str) -> None:
    big = _big()
    guesses = [0, 3, 10**29, big - 1]
    lines = ['["start",0]'] + [f'["value",0,0,["i","{g:x}"]]' for g in guesses] + ['["done",0,null]']
    lines += ['["value",0,0,["s","passed"]]', '["truth",0,0,true]', '["done",1,null]', '["done",0,null]']
    program = FORGE + f"forge({lines!r})\n" + ("os._exit(0)\n" if then == "exit" else "") + "def f():\n    return 0\n"
    record = {"tests": [{"assert": f"assert f() == {big}"}, {"call": "f", "args": [], "expected": big}]}
    verdict, _ = judged(program, record)
    assert verdict.outcome is W
    # the program's only channel leads to the judge, whose protocol forged lines break (runtime_error)
    assert verdict.detail in ("wrong_answer", "runtime_error")
    case = json.dumps(["case", 0, None, f"{big}\n", False])
    stdio = FORGE + f"forge([{case!r}])\nprint(0)\n"
    verdict, _ = judged(stdio, {"tests": [{"stdin": "", "stdout": f"{big}\n"}]})
    assert verdict[:3] == (W, 0.0, "wrong_answer")  # the case's process has no events pipe to forge on


GC_PATCH = """
import gc
def _returns_true(*args):
    return True
def _noop(*args):
    return None
def _noop_hook(test):
    def value(site, v):
        return None
    return value
PATCHES = {"strict_eq": _returns_true, "truth": _returns_true, "encode": _noop, "_value_hook": _noop_hook,
           "_truth_hook": _noop_hook, "send": _noop}
def patch_harness(names):
    for o in gc.get_objects():
        if type(o) is type(patch_harness) and o.__name__ in names and o.__code__.co_filename in {str(p) for p in sandbox_module.RUNNER}:
            o.__code__ = PATCHES[o.__name__].__code__
"""


@pytest.mark.parametrize("names", [["strict_eq", "truth"], ["encode"], ["_value_hook", "_truth_hook"], ["send"]])
def test_patching_the_harness_through_gc_does_not_pass_top_level_asserts(names: list[str]) -> None:
    big = _big()
    program = GC_PATCH + f"patch_harness({names!r})\ndef f(x=0):\n    return 0\n"
    record = {"tests": [{"assert": f"assert f() == {big}"}, {"call": "f", "args": [1], "expected": big},
                        {"check": f"def check(candidate):\n    assert candidate() == {big}\n", "entry_point": "f"},
                        {"assert": f"assert f() > {big}"}]}  # fmt: skip
    verdict, _ = judged(program, record)
    assert verdict.outcome is W
    assert verdict.score < 1.0
    # the value sites never enter the sandbox and must be reported: patched or not, they fail
    assert verdict.score <= 0.25


NESTED = {  # asserts inside a loop are not "top level", so a site never reported passes
    "assert_in_loop": lambda big: {"tests": [{"assert": f"for a in range(3):\n    assert f(a) == {big}"}]},
    "check_with_loop": lambda big: {"tests": [{"check": f"def check(candidate):\n    for a in range(3):\n"
                                                       f"        assert candidate(a) == {big}\n", "entry_point": "f"}]},
}  # fmt: skip
SILENCERS = {
    "gc_patch": GC_PATCH + "patch_harness(['_value_hook', '_truth_hook'])\n",
    "settrace": """
import sys
def local(frame, event, arg):
    if event == "line":
        frame.f_globals["__rlvr_value__"] = frame.f_globals["__rlvr_truth__"] = lambda *a: None
    return local
sys.settrace(lambda frame, event, arg: local if frame.f_code.co_filename.startswith("test_") else None)
""",
}


@pytest.mark.parametrize("record", sorted(NESTED))
@pytest.mark.parametrize("silencer", sorted(SILENCERS))
def test_silenced_nested_asserts_are_not_correct(silencer: str, record: str) -> None:
    verdict, _ = judged(SILENCERS[silencer] + "def f(x=0):\n    return 0\n", NESTED[record](_big()))
    assert verdict.outcome is W


FORGED_TRUTH = [json.dumps(e) for t in (0, 1) for e in (["start", t], ["truth", t, 0, True], ["done", t, None])]
TRUTH_FORGERS = {
    "forged_events": FORGE + f"forge({FORGED_TRUTH!r})\nos._exit(0)\n",
    "gc_patched_truth": GC_PATCH + "patch_harness(['truth'])\ndef is_prime(n):\n    return 0\n",
}


@pytest.mark.parametrize("how", [
    "forged_events",  # the program's process has no events descriptor: the judge, a process apart, owns it
    "gc_patched_truth",  # the audit hook refuses gc.get_objects
])  # fmt: skip
def test_forged_truth_reports_are_not_correct(how: str) -> None:
    verdict, _ = judged(TRUTH_FORGERS[how], {"tests": [{"assert": "assert is_prime(7)"}, {"assert": "assert is_prime(13)"}]})
    assert verdict.outcome is W


# Asserts whose expected side is not a literal (judged inside the sandbox), against programs that return wrong values
# and try to be judged right anyway
# (and that no constant answer passes either: a program that has every call answer True fails each of them)
INNER = {"tests": [{"assert": "assert is_prime(7) and not is_prime(8)"}, {"assert": "assert abs(half(1) - 0.5) < 1e-9"},
                   {"assert": "assert half(3) * 2 == 3"},
                   {"check": "def check(candidate):\n    assert candidate(13)\n    assert not candidate(91)\n",
                    "entry_point": "is_prime"}]}  # fmt: skip
WRONG = "def is_prime(n):\n    {attack}\n    return False\ndef half(x):\n    {attack}\n    return 0\n"
EVERY_DESCRIPTOR = """
import os, json
SITES = {0: [["truth", 0, 0, True]], 1: [["truth", 1, 0, True]], 2: [["value", 2, 0, ["i", "3"]]],
         3: [["truth", 3, 0, True], ["truth", 3, 1, True]]}  # what passing INNER reports
LINES = [json.dumps(e) for t in range(4) for e in (["start", t], *SITES[t], ["done", t, None])]
LINES += [json.dumps(["ok", ["b", True], []])] * 8 + [json.dumps(["loaded", []])]
DATA = "".join(line + "\\n" for line in LINES).encode()
def forge():
    paths = [f"/proc/{p}/fd/{fd}" for p in ("self", 1, 2, 3, 4) for fd in range(16)]
    paths += [f"/proc/{p}/mem" for p in (1, 2, 3)] + ["/dev/fd/3", "/dev/stdout"]
    for fd in range(3, 1024):
        try:
            os.write(fd, DATA)
        except OSError:
            pass
    for path in paths:  # (no /proc in the sandbox: none of these exist)
        try:
            with open(path, "wb", buffering=0) as f:
                f.write(DATA)
        except OSError:
            pass
"""
HARNESS_OBJECTS = """
import sys
def forge():
    always = lambda *a, **k: True
    f = sys._getframe()
    while f is not None:
        g = f.f_globals
        for name in ("truth", "strict_eq", "__rlvr_eq__"):
            if name in g:
                g[name] = always
        if "send" in g and "_truth_hook" in g:  # the harness's module: every report says passed
            send = g["send"]
            g["_truth_hook"] = lambda test: lambda site, v: send("truth", test, site, True)
            g["_value_hook"] = lambda test: lambda site, v: send("value", test, site, g["encode"](0.5))
            g["_answer"] = lambda *a: ["ok", ["b", True], []]
        for name in list(f.f_locals):
            if name in ("namespace", "g") and isinstance(f.f_locals[name], dict):
                f.f_locals[name]["__rlvr_truth__"] = g.get("_truth_hook", lambda t: always)(0)
        f = f.f_back
"""


@pytest.mark.parametrize("attack", ["every_descriptor_then_exit", "every_descriptor_in_calls", "harness_objects"])
def test_inner_asserts_are_judged_where_the_program_cannot_write(attack: str) -> None:
    """The program writes the events of INNER passing, and replies saying True, to every descriptor and every /proc
    path it can name (at load, then exits; or inside each call), or patches every harness function and namespace it
    reaches through its frames. Its functions return wrong values, and no assert whose expected side is not a
    literal passes."""
    setup = {"every_descriptor_then_exit": EVERY_DESCRIPTOR + "forge()\nos._exit(0)\n",
             "every_descriptor_in_calls": EVERY_DESCRIPTOR, "harness_objects": HARNESS_OBJECTS + "forge()\n"}[attack]
    verdict, elapsed = judged(setup + WRONG.format(attack="forge()"), INNER)
    assert (verdict.outcome, verdict.score) == (W, 0.0)
    assert elapsed < bound({})
    right = "def is_prime(n):\n    return n > 1 and all(n % d for d in range(2, n))\ndef half(x):\n    return x / 2\n"
    assert judged(right, INNER)[0][:3] == (C, 1.0, "passed")  # the same record is passable


# ---- 9. legit programs still pass -----------------------------------------------------------------------------------------

LEGIT = {
    "two_threads": """
import threading
def add(a, b):
    out = [0, 0]
    def put(i, v):
        out[i] = v
    threads = [threading.Thread(target=put, args=(0, a)), threading.Thread(target=put, args=(1, b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(out)
""",
    "file_in_cwd": """
import os
def add(a, b):
    with open("scratch.txt", "w") as f:
        f.write(f"{a} {b}")
    with open(os.path.join(os.getcwd(), "scratch.txt")) as f:
        x, y = map(int, f.read().split())
    os.remove("scratch.txt")
    return x + y
""",
    "stdlib": """
import math, itertools, collections, re, json, heapq, functools, fractions, decimal, bisect, string, random
def add(a, b):
    parts = [math.gcd(a, 0), next(itertools.islice(itertools.count(b), 1)), collections.Counter([1])[1] - 1,
             int(re.sub(r"\\D", "", "x0")), json.loads("0"), heapq.nsmallest(1, [0, 5])[0],
             functools.reduce(lambda x, y: x + y, [0]), int(fractions.Fraction(0, 3)), int(decimal.Decimal("0.0"))]
    return sum(parts)
""",
    "deep_recursion": """
import sys
sys.setrecursionlimit(20000)
def depth(n):
    return 0 if n == 0 else 1 + depth(n - 1)
def add(a, b):
    return a + b + depth(5000) - 5000
""",
    "debug_printing": """
def add(a, b):
    for i in range(300):
        print(f"debug {i}: adding {a} and {b} " + "." * 40)
    return a + b
""",
    "stderr_output": """
import sys

def add(a, b):
    print("note: " + "x" * 1000, file=sys.stderr)
    return a + b
""",
}


@pytest.mark.parametrize(("name", "mode"), [(n, m) for n in sorted(LEGIT) for m in MODES
                                            if (n, m) != ("debug_printing", "stdio")])  # stdio: stdout is the answer
def test_legit_programs_still_pass(name: str, mode: str) -> None:
    program = LEGIT[name] + (MAIN if mode == "stdio" else "")
    verdict, _ = judged(program, FUNC if mode == "functions" else STDIO)
    assert verdict[:3] == (C, 1.0, "passed")


def test_a_main_guarded_stdin_program_passes_every_case() -> None:
    program = "import sys\n\ndef main():\n    for line in sys.stdin:\n        a, b = map(int, line.split())\n        print(a + b)\n\n" \
              "if __name__ == \"__main__\":\n    main()\n"  # fmt: skip
    record = {"tests": [{"stdin": "1 2\n", "stdout": "3\n"}, {"stdin": "2 2\n5 6\n", "stdout": "4\n11\n"}]}
    assert judged(program, record)[0][:3] == (C, 1.0, "passed")


# ---- sandbox.check --------------------------------------------------------------------------------------------------------


def test_check_names_bubblewrap_when_it_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on PATH
    with pytest.raises(SandboxError, match="bubblewrap") as error:
        sandbox_module.check()
    assert "apt-get install bubblewrap" in str(error.value)
    verdict, _ = judged(ADD, FUNC)
    assert verdict[:3] == (Outcome.NO_ANSWER, 0.0, "sandbox_error")


def test_check_passes_where_bubblewrap_works() -> None:
    if shutil.which("bwrap") is None or not _sandbox_works():
        pytest.skip("bubblewrap cannot run here")
    assert sandbox_module.check() is None
