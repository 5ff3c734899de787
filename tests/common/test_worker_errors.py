"""A user error raised in a DataLoader worker keeps its one-line message in the parent process.

torch raises a worker's error again as ``type(err)(text)`` with the worker's traceback in ``text``; every
:class:`~specstore.common.errors.SpecstoreError` takes back its original line, so a command prints the cause.
"""

from __future__ import annotations

import pytest

from specstore.common.cli import run_cli
from specstore.common.errors import ConfigError, SpecstoreError, worker_message
from specstore.store.errors import StoreCorrupt


def _in_a_worker(err: SpecstoreError) -> SpecstoreError:
    """``err`` as torch raises it again in the parent of the DataLoader worker that raised it."""
    from torch._utils import ExceptionWrapper

    try:
        raise err
    except SpecstoreError:
        wrapped = ExceptionWrapper(where="in DataLoader worker process 3")
    with pytest.raises(type(err)) as again:
        wrapped.reraise()
    return again.value


@pytest.mark.parametrize("err", [ConfigError("bad --budget-mb: -1"),
                                 StoreCorrupt("s.zarr: shard mel/s0001 is shorter than the index says: x: y")],
                         ids=["config", "corrupt"])
def test_a_worker_error_keeps_its_one_line(err: SpecstoreError, capsys: pytest.CaptureFixture[str]) -> None:
    again = _in_a_worker(err)
    assert str(again) == str(err) and type(again) is type(err)

    def body() -> int:
        raise again

    assert run_cli(body) == 2
    assert capsys.readouterr().err == f"specstore: error: {err}\n"


def test_other_messages_are_left_alone() -> None:
    text = "Caught nothing here\nbut: two lines"
    assert worker_message(text) == text  # not torch's worker report
    assert worker_message("a: b") == "a: b"
    assert str(ConfigError("one line")) == "one line"
    assert ConfigError().args == ()
