"""``python -m specstore.democorpus OUT_DIR [options]``: see :mod:`specstore.democorpus.cli`."""

import sys

from .cli import main

sys.exit(main())
