"""Uploads in, bounded: bytes admitted by client and as they arrive, then streamed part by part to the server's files.

The unit of admission is bytes, held against the server's in-flight budget
(:class:`ByteBudget`, ``max_inflight_mb``: the bound on its temporary disk
for uploads).  What a request holds is what has arrived plus a window
(``upload_window_bytes``: the budget over ``max_connections``, at least
64 KiB), never more than its declared ``Content-Length``; the window is
reserved from the headers, before a byte of the body is read, and the
reservation grows as the body arrives.  A request no budget could ever
hold is answered 413 from its headers.

Why a window and not the whole declared length: a reservation of the
declared length costs the client nothing to keep.  A connection that
declares the whole budget and sends just above the minimum rate would
hold it for hours (at the defaults, four such hold 3.2 GB for about 14
hours).  With a window, bytes held are bytes sent (plus the window), so
holding the budget costs a client the bandwidth of filling it, and the
windows of every connection the server accepts fit in the budget
together (where it allows 64 KiB a connection).  What a window gives up,
an admitted upload that is always finished, is taken back by the rules
below, which apply only when the budget is full.

Who gets the bytes.  A client is a source address.  One client holds at
most ``client_inflight_bytes`` (``max_client_inflight_mb``, default half
the budget, at least one file); a request larger than that is 413, a
request that would pass it now 503 + ``Retry-After``.  When a request
needs bytes and the budget is full, in order:

1. uploads that stalled (nothing sent for 2 s while the server was ready
   to read) are dropped and their bytes freed at once
   (:meth:`specstore.serving.connections.ConnectionGuard.drop_stalled`, the budget's
   ``on_full``);
2. while another client holds more than the asking client would hold with
   the new bytes, the newest upload still arriving from the client that
   holds the most is cut (503 + ``Retry-After``, its connection closed,
   its bytes freed at once: :meth:`specstore.serving.connections.ConnectionGuard.cut`).
   So each client is sure of an equal share of a full budget (max-min
   fairness): no client, and no group of clients, keeps out a client that
   asks for less than they hold.  (An upload whose address came from a
   proxy's ``X-Forwarded-For`` is never cut: its connection is the
   proxy's, which buffers bodies anyway);
3. otherwise the request is answered 503 + ``Retry-After`` (its bytes so
   far freed, its files removed).

And one request's upload takes at most ``max_upload_s`` in all, however
fast it keeps sending (:mod:`specstore.serving.connections`), so no upload holds
bytes or its connection for longer.  A chunked body (no length) is held
the same way, cut off at the request limit.

The body is parsed as it streams (python-multipart's parser, the one
Starlette uses) and each file is written to a file of the server's own
naming in its private folder, cut off at ``max_file_mb``; nothing of an
upload is held in memory but the current chunk.  So the server's
temporary disk for uploads is at most the budget (a cut upload's files
outlive their bytes only until its handler sees the disconnect), and its
memory does not grow with upload sizes.

:func:`receive_uploads` returns the files; the caller decodes them by path
and deletes them (:meth:`Uploads.remove`) when its request ends, whatever
the reason (a decode worker that dies cannot leave one behind).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import ClientDisconnect, Request

from .config import ServeConfig
from .errors import Refused
from .tally import ClientTally

__all__ = ["ByteBudget", "Refused", "Reservation", "Upload", "Uploads", "client_name", "make_folder",
           "receive_uploads"]

_NAME_CHARS = 200
_MAX_FIELDS = 16  # non-file form fields accepted (and ignored) per request
_MAX_FIELD_BYTES = 4096


Peer = tuple[str, int]
"""A connection: the client's address and port."""


@dataclass(eq=False)
class Reservation:
    """One request's hold on the upload budget.

    ``client``: its address (the unit of a share); ``peer``: its connection; ``close``: closes that
    connection with a 503 saying why, and says whether it found it (None: it cannot be cut); ``held``:
    bytes reserved; ``started`` (monotonic s); ``receiving`` while its body arrives (only then may it be
    cut); ``cut``: why its bytes were taken back, or None.
    """

    client: str
    peer: Peer | None = None
    close: Callable[[str], bool] | None = None
    held: int = 0
    started: float = field(default_factory=time.monotonic)
    receiving: bool = True
    cut: str | None = None


class ByteBudget:
    """Upload bytes the server holds at once (reserved by requests in progress), at most ``capacity``, shared
    by client address (see the module docstring for who gets them when it is full).

    ``on_full``: drops the uploads that stalled and returns their peers (their bytes are freed at once).
    Used from the event loop's thread only.
    """

    def __init__(self, capacity: int, on_full: Callable[[], Iterable[Peer]] | None = None) -> None:
        self.capacity = capacity
        self.on_full = on_full
        self.held = ClientTally()  # bytes, in all and by client address
        self.receiving: set[Reservation] = set()

    @property
    def used(self) -> int:
        return self.held.total

    def reserve(self, res: Reservation, n: int, share: int) -> str | None:
        """Add ``n`` bytes to ``res``; None when they are held, else why not: ``"cut"`` (its bytes were taken
        back), ``"client"`` (its client would hold more than ``share``) or ``"total"`` (the budget is full,
        after dropping stalled uploads and cutting those of clients that hold more)."""
        if res.cut is not None:
            return "cut"
        if self.held.by_client[res.client] + n > share:
            return "client"
        if self.used + n > self.capacity and self.on_full is not None:
            stalled = set(self.on_full())
            for r in [r for r in self.receiving if r.peer in stalled and r is not res]:
                self._take_back(r, "stalled")
        if self.used + n > self.capacity:
            self._make_room(res, n)
        if self.used + n > self.capacity:
            return "total"
        self.held.add(res.client, n)
        res.held += n
        if res.receiving:
            self.receiving.add(res)
        return None

    def _make_room(self, res: Reservation, n: int) -> None:
        """Cut the newest upload of the client holding the most while the budget cannot give ``n`` more to
        ``res`` and that client holds more than ``res``'s would with them.  An upload whose connection cannot
        be found (its address came from a proxy's ``X-Forwarded-For``) is never cut: its files would stay."""
        after = self.held.by_client[res.client] + n
        while self.used + n > self.capacity:
            victims = [r for r in self.receiving
                       if r.close is not None and r.client != res.client and self.held.by_client[r.client] > after]
            if not victims:
                return
            victim = max(victims, key=lambda r: (self.held.by_client[r.client], r.started))
            assert victim.close is not None
            holds = self.held.by_client[victim.client]
            if not victim.close(f"the server's upload budget is full and your address held {holds} bytes of "
                                f"uploads in progress, more than others: this upload gave way to another "
                                f"client's; retry shortly"):
                victim.close = None
                continue
            self._take_back(victim, "cut")

    def _take_back(self, res: Reservation, why: str) -> None:
        res.cut = why
        self.release(res)

    def finish(self, res: Reservation, size: int) -> None:
        """``res``'s body is whole at ``size`` bytes: it holds that much from now on and can no longer be cut."""
        res.receiving = False
        self.receiving.discard(res)
        if res.held > size:
            self.held.remove(res.client, res.held - size)
            res.held = size

    def release(self, res: Reservation) -> None:
        """Free every byte ``res`` holds."""
        self.receiving.discard(res)
        if res.held:
            self.held.remove(res.client, res.held)
            res.held = 0


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
    """The files of one request and its hold on the budget; :meth:`remove` deletes the files, frees the bytes."""

    files: list[Upload] = field(default_factory=list)
    reservation: Reservation | None = None

    def remove(self, budget: ByteBudget) -> None:
        for up in self.files:
            if up.path is not None:
                with contextlib.suppress(FileNotFoundError):
                    up.path.unlink()
        if self.reservation is not None:
            budget.release(self.reservation)


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


def _hold(budget: ByteBudget, res: Reservation, n: int, config: ServeConfig) -> None:
    """Reserve ``n`` more bytes for ``res``, or raise :class:`Refused` (503 + ``Retry-After``) saying why not."""
    why = budget.reserve(res, n, config.client_inflight_bytes)
    if why is None:
        return
    retry = {"Retry-After": str(config.retry_after)}
    if why == "client":
        raise Refused(503, f"your address holds {budget.held.by_client[res.client]} bytes of uploads in progress "
                           f"and may hold {config.client_inflight_bytes} at once (--max-client-inflight-mb); "
                           f"retry when they are done", retry)
    if why == "cut":
        raise Refused(503, "this upload gave way to another client's share of the upload budget; retry shortly",
                      retry)
    raise Refused(503, f"the server holds {budget.used} bytes of uploads in progress and cannot take {n} more "
                       f"now; retry shortly", retry)


def _admit(request: Request, config: ServeConfig) -> tuple[bytes, int | None]:
    """The multipart boundary and the declared length (None: chunked) of ``request``; raises :class:`Refused`
    (400 when it is no multipart upload, 413 when its length is over what one client may send)."""
    _, params = parse_options_header(request.headers.get("content-type", ""))
    boundary = params.get(b"boundary")
    if not request.headers.get("content-type", "").lower().startswith("multipart/form-data") or not boundary:
        raise Refused(400, "no files: send multipart/form-data with one or more file fields")
    length = request.headers.get("content-length")
    if length is None:
        return boundary, None
    if not length.isdigit():
        raise Refused(400, "bad Content-Length")
    declared, limit = int(length), config.max_request_bytes
    if declared > limit:
        raise Refused(413, f"request of {declared} bytes is over the limit of {limit} bytes "
                           f"({config.max_files} files of {config.max_file_mb:g} MiB, within the "
                           f"{config.client_inflight_bytes} bytes one client may hold in flight)")
    return boundary, declared


async def receive_uploads(request: Request, folder: Path, config: ServeConfig, budget: ByteBudget,
                          names: itertools.count[int], cut: Callable[[Peer, str], bool] | None = None) -> Uploads:
    """Admit ``request`` by its bytes and stream its files into ``folder``; raises :class:`Refused`.

    The request holds what has arrived of its body plus a window of the budget (see the module docstring);
    ``cut`` closes a connection (address, port) with a 503 saying why, so that this upload can give way to
    another client's (None: it never does).  The caller owns the returned :class:`Uploads` and must
    :meth:`~Uploads.remove` them; on a refusal everything written so far is removed here.  ``names``
    numbers the server's files.
    """
    boundary, declared = _admit(request, config)
    limit = config.max_request_bytes
    cap = declared if declared is not None else limit
    peer = (request.client.host, request.client.port) if request.client else None
    res = Reservation(peer[0] if peer else "", peer,
                      functools.partial(cut, peer) if cut is not None and peer is not None else None)
    out = Uploads(reservation=res)
    _hold(budget, res, min(cap, config.upload_window_bytes), config)
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
            if seen > res.held:  # what arrived plus a window, never past what was declared
                _hold(budget, res, min(cap, seen + config.upload_window_bytes) - res.held, config)
            parser.write(chunk)
        parser.finalize()
        budget.finish(res, seen)
    except BaseException as e:  # whatever ends the body early: nothing of it stays on disk or reserved
        parts.close()
        out.remove(budget)
        if res.cut is not None and not isinstance(e, Refused):
            raise Refused(503, "this upload gave way to others (the upload budget is full); retry shortly",
                          {"Retry-After": str(config.retry_after)}) from None
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
