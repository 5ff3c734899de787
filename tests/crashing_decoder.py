"""A decode function that kills its worker process, as a decoder crashing on a hostile file would."""

from __future__ import annotations

import os
from typing import Any


def crash(*args: Any, **kwargs: Any) -> Any:
    os._exit(3)
