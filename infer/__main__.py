"""``python -m infer COMMAND ...``: predict, plan, init, train, eval (see :mod:`infer.cli`)."""

import sys

from .cli import main

sys.exit(main())
