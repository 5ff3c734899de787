"""A command's log shows its level and above, even from a library that sets its own logger to INFO (as dask's
``distributed`` does at import): ``setup_logging`` holds the handler to the level, not only the root logger."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import logging, sys
from specstore.common import setup_logging
setup_logging(getattr(logging, sys.argv[1]))
library = logging.getLogger("somelibrary")
library.setLevel(logging.INFO)
library.info("started a scheduler")
library.warning("lost a worker")
logging.getLogger("specstore.infer").info("planned 3 batches")
"""


@pytest.mark.parametrize(("level", "expected"), [
    ("WARNING", ["WARNING somelibrary: lost a worker"]),
    ("INFO", ["INFO somelibrary: started a scheduler", "WARNING somelibrary: lost a worker",
              "INFO specstore.infer: planned 3 batches"]),
])
def test_a_library_at_info_is_held_to_the_commands_level(level: str, expected: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-c", SCRIPT, level], capture_output=True, text=True, timeout=60,
                          check=True)
    assert proc.stderr.splitlines() == expected


def test_a_handler_already_there_is_left_alone() -> None:
    import logging

    from specstore.common import setup_logging

    root = logging.getLogger()
    mine = logging.StreamHandler()
    mine.setLevel(logging.DEBUG)
    root.addHandler(mine)
    try:
        setup_logging(logging.WARNING)
        assert mine.level == logging.DEBUG
    finally:
        root.removeHandler(mine)
