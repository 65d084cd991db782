"""`python -m hvd_lite.run`: the same launcher as the `hvd_lite.run` console script."""

import sys

from .cli import main

sys.exit(main())
