"""``python -m specstore demo-corpus OUT_DIR [options]``: see :mod:`specstore.democorpus.cli`."""

import sys

from .cli import main

sys.exit(main())
