"""``python -m specstore VERB ...`` = ``specstore VERB ...`` (:mod:`specstore.cli`)."""

import sys

from .cli import main

sys.exit(main())
