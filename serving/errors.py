"""The classify service's errors, gathered in one module: what one file and what a ``/classify`` request can fail
with.

One file: a :class:`ClipError` is the upload's fault (not audio, too long), a :class:`ServerFault` (such as a
:class:`BatchError`) the server's; either fails that file alone.  A request: a :class:`RequestError` names what
went wrong and carries what its answer needs (a ``Retry-After``, the file, the per-file answers);
:mod:`specstore.serving.responses` maps them to HTTP responses in one place, so neither the routes nor
:class:`specstore.serving.service.Service` build an error response.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specstore.common.errors import SpecstoreError

if TYPE_CHECKING:
    from .answers import Failed

__all__ = ["BatchError", "ClipError", "FileRefused", "InternalError", "NoFileClassified", "NotRunning", "Refused",
           "RequestError", "ServerFault", "TimedOut"]


class ClipError(SpecstoreError):
    """A file or upload that cannot be classified: not audio, too long, too short; one line, no server paths."""


class ServerFault(SpecstoreError):
    """One file failed on the server's side (a stopped decode pool, a failed batch), not through its upload."""


class BatchError(ServerFault):
    """The model failed on a batch, or the batcher stopped (its clips' requests get this one-line error)."""


class RequestError(SpecstoreError):
    """A request answered with an error (one line: ``message``)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Refused(RequestError):
    """A request refused before its files are decoded: HTTP ``status``, a one-line ``message``, extra headers.

    Its body may be unread, so the connection closes after the answer.
    """

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers or {}


class NotRunning(RequestError):
    """The service has not started or has stopped; retry after ``retry_after`` seconds."""

    def __init__(self, retry_after: int) -> None:
        super().__init__("the server is not running")
        self.retry_after = retry_after


class FileRefused(RequestError):
    """The request's only file was refused by a limit while it arrived (``file``: the client's name)."""

    def __init__(self, message: str, file: str) -> None:
        super().__init__(message)
        self.file = file


class TimedOut(RequestError):
    """The request took longer than ``seconds``."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"the request took longer than {seconds:g} s")
        self.seconds = seconds


class NoFileClassified(RequestError):
    """Every file failed: ``failures`` says why for each; ``server_fault`` when one failed on the server's side."""

    def __init__(self, failures: list[Failed]) -> None:
        super().__init__(failures[0].error if len(failures) == 1 else "no file could be classified")
        self.failures = failures
        self.server_fault = any(f.server_fault for f in failures)


class InternalError(RequestError):
    """A bug: logged by the server, answered without details."""

    def __init__(self) -> None:
        super().__init__("internal error (logged by the server)")
