"""``python -m realcorpus OUT``: see :mod:`realcorpus.generate`."""

import sys

from .generate import main

sys.exit(main())
