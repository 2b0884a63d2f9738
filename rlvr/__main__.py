"""`python -m rlvr` (and `torchrun -m rlvr`) work like the `rlvr` script."""

import sys

from rlvr.cli import main

sys.exit(main())
