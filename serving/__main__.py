"""``python -m specstore classify|serve ...`` = ``specstore classify|serve ...``."""

import sys

from .cli import main

sys.exit(main())
