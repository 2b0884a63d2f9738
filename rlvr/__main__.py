"""`python -m rlvr` (and `torchrun -m rlvr`) work like the `rlvr` script."""

from rlvr.cli import entry

if __name__ == "__main__":  # verifier workers are spawned: they re-import this module and must not train
    entry()
