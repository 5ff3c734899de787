"""``python -m democorpus OUT_DIR [options]``: see :mod:`democorpus.cli`."""

import sys

from .cli import main

sys.exit(main())
