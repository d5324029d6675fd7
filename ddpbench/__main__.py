import sys

from ddpbench.cli import main

sys.exit(main())
