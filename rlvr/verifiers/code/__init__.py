"""The code verifier: a folder whose modules are named by where they run.

- verifier.py: the front the rewards call (reward.verifier=code: verify, score, judge, extract, check_gold), outside
  the sandbox; it reads the program out of the completion and the record out of the row, and decides the verdict from
  what the harness reports.
- record.py: the test record (its one definition, shared with the code tasks, rlvr.tasks.code).
- sandbox.py: around the program: bubblewrap, resource limits, the seccomp filter, the wall-clock kill, the caps on
  what comes back; it starts the harness.
- harness.py, judge.py, program.py: inside the sandbox, standard library only, one namespace: the harness's process
  (its entry, the wire format, the stdio runner), the judge that runs the tests outside the program's process, and the
  program's own process that answers the judge.

This module is the front: what the rest of rlvr uses (the rewards, the python tool's sandbox, the start-up checks).
"""

from rlvr.verifiers.code.sandbox import Limits, RunResult, SandboxError
from rlvr.verifiers.code.sandbox import check as check_sandbox
from rlvr.verifiers.code.sandbox import run as run_sandboxed
from rlvr.verifiers.code.verifier import DETAILS, check_gold, extract, score, verify

# (the verdict function, verifier.judge, is not re-exported: `judge` names the module judge.py in this folder)
__all__ = ["DETAILS", "Limits", "RunResult", "SandboxError", "check_gold", "check_sandbox", "extract", "run_sandboxed",
           "score", "verify"]  # fmt: skip
