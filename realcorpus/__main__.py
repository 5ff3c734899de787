"""``python -m specstore realcorpus OUT``: see :mod:`specstore.realcorpus.generate`."""

import sys

from .generate import main

sys.exit(main())
