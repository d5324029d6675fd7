"""``python -m ddpbench``: the same command line as the ``ddpbench`` script."""

import sys

from ddpbench.cli import main

sys.exit(main())
