"""``python -m specstore.infer COMMAND ...``: predict, plan, init, train, eval (see :mod:`specstore.infer.cli`)."""

import sys

from .cli import main

sys.exit(main())
