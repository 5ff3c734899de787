"""Uploads in, bounded: bytes admitted from a request's headers, then streamed part by part to the server's files.

The unit of admission is bytes.  A request's ``Content-Length`` is
reserved against the server's in-flight budget (:class:`ByteBudget`,
``max_inflight_mb``) from its headers, before a byte of its body is read;
a request the budget cannot hold now is answered 503 with
``Retry-After``, and one that no budget could ever hold 413.  Slow
clients holding the budget are dropped by their read deadline, and at
once when the budget is full and their upload has stalled (the server
passes :meth:`serving.connections.ConnectionGuard.drop_stalled` as
``on_full``), so a client ready to send gets in on its retry.  A chunked
body (no length) is reserved as it arrives and cut off at the budget.
The body is parsed as
it streams (python-multipart's parser, the one Starlette uses) and each
file is written to a file of the server's own naming in its private
folder, cut off at ``max_file_mb``; nothing of an upload is held in memory
but the current chunk.  So the server's temporary disk for uploads is at
most the budget, and its memory does not grow with upload sizes.

:func:`receive_uploads` returns the files; the caller decodes them by path
and deletes them (:meth:`Uploads.remove`) when its request ends, whatever
the reason (a decode worker that dies cannot leave one behind).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import tempfile
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import ClientDisconnect, Request

from .config import ServeConfig
from .errors import Refused

__all__ = ["ByteBudget", "Refused", "Upload", "Uploads", "client_name", "make_folder", "receive_uploads"]

_NAME_CHARS = 200
_MAX_FIELDS = 16  # non-file form fields accepted (and ignored) per request
_MAX_FIELD_BYTES = 4096


class ByteBudget:
    """Upload bytes the server holds at once (reserved by requests in progress), at most ``capacity``.

    Used from the event loop's thread only.
    """

    def __init__(self, capacity: int, on_full: Callable[[], object] | None = None) -> None:
        self.capacity = capacity
        self.used = 0
        self.on_full = on_full

    def try_reserve(self, n: int) -> bool:
        """Reserve ``n`` bytes if they fit now; whether they did (``on_full`` is called when they did not)."""
        if self.used + n > self.capacity:
            if self.on_full is not None:
                self.on_full()
            return False
        self.used += n
        return True

    def release(self, n: int) -> None:
        self.used -= n


def client_name(raw: str, index: int) -> str:
    """The name to echo back: the client's file name (only ever text in an answer), or ``file-N``."""
    name = raw.replace("\\", "/").rsplit("/", 1)[-1]
    name = "".join(ch for ch in name if ch.isprintable())[:_NAME_CHARS]
    return name or f"file-{index + 1}"


@dataclass
class Upload:
    """One uploaded file: the client's ``name`` (text only), its ``path`` in the server's folder (None when it
    was refused: ``error`` says why) and its ``size`` in bytes."""

    name: str
    path: Path | None
    size: int = 0
    error: str | None = None


@dataclass
class Uploads:
    """The files of one request and the bytes it reserved; :meth:`remove` deletes the files, frees the bytes."""

    files: list[Upload] = field(default_factory=list)
    reserved: int = 0

    def remove(self, budget: ByteBudget) -> None:
        for up in self.files:
            if up.path is not None:
                with contextlib.suppress(FileNotFoundError):
                    up.path.unlink()
        budget.release(self.reserved)
        self.reserved = 0


class _Parts:
    """python-multipart callbacks writing each file part to its own file, within the per-file and count limits."""

    def __init__(self, folder: Path, config: ServeConfig, out: Uploads, names: itertools.count[int]) -> None:
        self.folder, self.config, self.out, self.names = folder, config, out, names
        self.max_files = min(config.max_files, config.max_queue)
        self.header_field = b""
        self.header_value = b""
        self.disposition = b""
        self.current: Upload | None = None
        self.handle: Any = None
        self.fields = 0
        self.field_bytes = 0

    def on_part_begin(self) -> None:
        self.disposition = b""
        self.current = None
        self.field_bytes = 0

    def on_header_field(self, data: bytes, start: int, end: int) -> None:
        self.header_field += data[start:end]

    def on_header_value(self, data: bytes, start: int, end: int) -> None:
        self.header_value += data[start:end]

    def on_header_end(self) -> None:
        if self.header_field.lower() == b"content-disposition":
            self.disposition = self.header_value
        self.header_field = self.header_value = b""

    def on_headers_finished(self) -> None:
        _, options = parse_options_header(self.disposition)
        if b"filename" not in options:
            self.fields += 1
            if self.fields > _MAX_FIELDS:
                raise Refused(400, f"malformed upload: more than {_MAX_FIELDS} form fields")
            return
        index = len(self.out.files)
        if index >= self.max_files:
            which = ("--max-files" if self.max_files == self.config.max_files else "--max-queue")
            raise Refused(413, f"too many files: the limit is {self.max_files} per request ({which})")
        name = client_name(options[b"filename"].decode("utf-8", "replace"), index)
        path = self.folder / f"upload-{next(self.names)}"
        self.current = Upload(name, path)
        self.out.files.append(self.current)
        self.handle = open(path, "xb")  # noqa: SIM115  (closed in on_part_end or close())

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        up = self.current
        if up is None:  # a plain form field: bounded, then ignored
            self.field_bytes += end - start
            if self.field_bytes > _MAX_FIELD_BYTES:
                raise Refused(400, f"malformed upload: a form field over {_MAX_FIELD_BYTES} bytes")
            return
        up.size += end - start
        if up.error is not None:
            return
        if up.size > self.config.max_file_bytes:  # cut off: the rest of this part is read and dropped
            self.close()
            assert up.path is not None
            up.path.unlink()
            up.path = None
            up.error = f"file is over the limit of {self.config.max_file_mb:g} MiB"
            return
        self.handle.write(data[start:end])

    def on_part_end(self) -> None:
        self.close()
        self.current = None

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()
            self.handle = None


async def _body(request: Request) -> AsyncIterator[bytes]:
    async for chunk in request.stream():
        if chunk:
            yield chunk


async def receive_uploads(request: Request, folder: Path, config: ServeConfig, budget: ByteBudget,
                          names: itertools.count[int]) -> Uploads:
    """Admit ``request`` by its bytes and stream its files into ``folder``; raises :class:`Refused`.

    The caller owns the returned :class:`Uploads` and must :meth:`~Uploads.remove` them; on a refusal
    everything written so far is removed here.  ``names`` numbers the server's files.
    """
    _, params = parse_options_header(request.headers.get("content-type", ""))
    boundary = params.get(b"boundary")
    if not request.headers.get("content-type", "").lower().startswith("multipart/form-data") or not boundary:
        raise Refused(400, "no files: send multipart/form-data with one or more file fields")
    limit = config.max_request_bytes
    out = Uploads()
    length = request.headers.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise Refused(400, "bad Content-Length")
        declared = int(length)
        if declared > limit:
            raise Refused(413, f"request of {declared} bytes is over the limit of {limit} bytes "
                               f"({config.max_files} files of {config.max_file_mb:g} MiB, within "
                               f"{config.max_inflight_bytes} bytes in flight)")
        if not budget.try_reserve(declared):
            raise Refused(503, f"the server holds {budget.used} bytes of uploads in progress and cannot take "
                               f"{declared} more now; retry shortly", {"Retry-After": str(config.retry_after)})
        out.reserved = declared
    parts = _Parts(folder, config, out, names)
    callbacks = {name: getattr(parts, name) for name in (
        "on_part_begin", "on_part_data", "on_part_end", "on_header_field", "on_header_value", "on_header_end",
        "on_headers_finished")}
    parser = MultipartParser(boundary, callbacks)  # type: ignore[arg-type]
    seen = 0
    try:
        async for chunk in _body(request):
            seen += len(chunk)
            if seen > limit:
                raise Refused(413, f"request body is over the limit of {limit} bytes")
            if length is None:  # chunked: reserve as it arrives, cut off at the budget
                if not budget.try_reserve(len(chunk)):
                    raise Refused(503, "the server holds too many bytes of uploads in progress; retry shortly",
                                  {"Retry-After": str(config.retry_after)})
                out.reserved += len(chunk)
            parser.write(chunk)
        parser.finalize()
    except BaseException as e:  # whatever ends the body early: nothing of it stays on disk or reserved
        parts.close()
        out.remove(budget)
        if isinstance(e, FormParserError):
            raise Refused(400, f"malformed upload: {e}".splitlines()[0]) from None
        if isinstance(e, ClientDisconnect):
            raise Refused(400, "the client went away") from None
        raise
    if not out.files:
        out.remove(budget)
        raise Refused(400, "no files: send multipart/form-data with one or more file fields")
    return out


def make_folder(parent: str | os.PathLike[str] | None = None) -> Path:
    """A new private folder (mode 700) for one server's uploads, in ``parent`` or the system's temporary one."""
    return Path(tempfile.mkdtemp(prefix="specstore-uploads-", dir=parent))
