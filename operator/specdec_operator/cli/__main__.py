"""`python -m specdec_operator.cli`: the same as the `specdec` console script."""

import sys

from . import main

sys.exit(main())
