"""Decoder warnings: which C library wrote a line on stderr, how many came from each, and the run's summary line.

:mod:`specstore.pipeline.decoder_log` catches the lines; this module names and counts
them (:class:`DecoderWarnings`) and logs them under :data:`LOGGER`.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field

__all__ = ["LOGGER", "MAX_LINES", "MAX_LINE_BYTES", "DecoderWarnings", "library_of", "log_lines", "log_summary"]

#: The logger decoder warnings are logged under (INFO: shown with -v).
LOGGER = "specstore.decoder"
log = logging.getLogger(LOGGER)

#: Lines a result keeps for the parent to log (the count stays exact beyond it).
MAX_LINES = 1000
#: Longest line kept or sent, in bytes: one pipe write of it is atomic (POSIX PIPE_BUF is at least 512, Linux 4096).
MAX_LINE_BYTES = 3800

# "[src/libmpg123/layer3.c:INT123_do_layer3():1774] error: ..." (the source file of a C library, then a space)
_C_MESSAGE = re.compile(r"\[((?:[\w.+-]+/)*[\w.+-]+\.c)(?::[^\]\n]*)?\] ")
# libmpg123's notes while it looks for frames (parse.c), printed with no source file: "Note: Illegal
# Audio-MPEG-Header 0x4e4b4a55 at offset 16110.", "Note: Trying to resync...", "Note: Skipped 128 bytes in input."
_MPG123_NOTE = re.compile(r"^Note: (?:Illegal Audio-MPEG-Header|Trying to resync|Hit end of \(available\) data|"
                          r"Skipped |Junk at the beginning|Looks like a RIFF header|Could be a BMP album art|"
                          r"free format frame size)")


def library_of(line: str) -> str | None:
    """The C library that wrote ``line`` (``libmpg123``), the source file when no folder names one, or None.

    None means the line is not a C library's message (``[path/file.c:...] ``
    somewhere in it, or one of libmpg123's ``Note: ...`` lines about the
    frames it skips): it is passed through, never counted.
    """
    if _MPG123_NOTE.match(line):
        return "libmpg123"
    m = _C_MESSAGE.search(line)
    if m is None:
        return None
    parts = m.group(1).split("/")
    return next((p for p in parts[:-1] if p.startswith("lib")), parts[-1])


@dataclass
class DecoderWarnings:
    """Decoder warnings counted in one run or task: ``counts`` by library, ``shown`` of them already on stderr.

    ``lines``: the first :data:`MAX_LINES` of those not shown, for the
    parent to log (:func:`log_lines`); ``counts`` stay exact beyond it.
    """

    counts: dict[str, int] = field(default_factory=dict)
    shown: int = 0
    lines: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def record(self, library: str, line: str | None = None, *, shown: bool = False) -> None:
        """Count one warning of ``library``: ``shown`` if it is on stderr already, ``line`` kept to be logged."""
        self.counts[library] = self.counts.get(library, 0) + 1
        if shown:
            self.shown += 1
        elif line is not None and len(self.lines) < MAX_LINES:
            self.lines.append(line)

    def add(self, other: DecoderWarnings) -> None:
        """Add ``other``'s counts, and its lines while fewer than :data:`MAX_LINES` are kept."""
        for lib, n in other.counts.items():
            self.counts[lib] = self.counts.get(lib, 0) + n
        self.shown += other.shown
        self.lines.extend(other.lines[:max(0, MAX_LINES - len(self.lines))])

    def take(self) -> DecoderWarnings:
        """Everything recorded so far, leaving this empty."""
        out = DecoderWarnings(self.counts, self.shown, self.lines)
        self.counts, self.shown, self.lines = {}, 0, []
        return out

    def summary(self, during: str = "during this run") -> str | None:
        """One line for the end of a run (None when there was nothing): how many, from which library, where to see them.

        ``12 decoder warnings (libmpg123) during this run; ...``: the files
        they concern still decoded (those that did not are reported as
        failures on their own), so this is a note, not an error.
        """
        n = self.total
        if not n:
            return None
        libraries = ", ".join(sorted(self.counts))
        if self.shown == n:
            where = "printed above"
        elif log.isEnabledFor(logging.INFO):
            where = f"logged above as {LOGGER}"
        else:
            where = "-v shows them"
        return (f"{n} decoder warning{'s' if n != 1 else ''} ({libraries}) {during}; files that could not be "
                f"decoded are reported on their own; {where}")


def log_lines(warnings: DecoderWarnings) -> None:
    """Log the lines of ``warnings`` (decoded elsewhere, not yet shown) at INFO under :data:`LOGGER`."""
    for line in warnings.lines:
        log.info("%s", line)


def log_summary(warnings: DecoderWarnings, during: str = "during this run") -> None:
    """Log :meth:`DecoderWarnings.summary` at WARNING (nothing when there were none): the run's one line."""
    line = warnings.summary(during)
    if line is not None:
        log.warning("%s", line)
