"""`python -m hack.devcluster ...` (from the checkout's root): the command line of hack/devcluster/cli.py."""

import sys

from .cli import main

sys.exit(main())
