"""`python -m rlvr` (and `torchrun -m rlvr`) work like the `rlvr` script."""

import sys

from rlvr.cli import main

if __name__ == "__main__":  # verifier workers are spawned: they re-import this module and must not train
    sys.exit(main())
