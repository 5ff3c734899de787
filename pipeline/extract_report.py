"""What an extraction run reports: :class:`ExtractSummary` (counts, seconds, bytes) and :class:`ExtractError`."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from .decoder_log import DecoderWarnings
from .errors import ExtractError

__all__ = ["ExtractError", "ExtractSummary", "dir_bytes", "human_bytes"]


@dataclass
class ExtractSummary:
    """What one extraction run did. Times in seconds, sizes in bytes."""

    store: str
    files: int = 0
    decoded: int = 0
    indexed: int = 0
    duplicates: int = 0
    unchanged: int = 0
    refreshed: int = 0
    changed: int = 0
    missing: int = 0
    removed: int = 0
    repaired: int = 0
    audio_seconds: float = 0.0
    errors: dict[str, str] = field(default_factory=dict)
    store_bytes: int | None = None
    wall_seconds: float = 0.0
    clips_in_store: int = 0
    jobs: int = 0
    decoder: DecoderWarnings = field(default_factory=DecoderWarnings)  # the C decoders' messages on stderr

    def report(self, max_errors: int = 20) -> str:
        """A short human-readable summary, bad files with their reasons included."""
        rate = self.audio_seconds / self.wall_seconds if self.wall_seconds else 0.0
        size = "unknown" if self.store_bytes is None else human_bytes(self.store_bytes)
        lines = [
            f"store        {self.store}",
            f"files found  {self.files:,}",
            f"decoded      {self.decoded:,} clips, {self.audio_seconds / 3600:.2f} h of audio ({rate:,.0f}x realtime)",
            f"indexed      {self.indexed:,} paths this run; {self.clips_in_store:,} in the store",
            f"duplicates   {self.duplicates:,} paths whose content was already decoded",
            f"unchanged    {self.unchanged:,} paths already in the store"
            + (f" ({self.refreshed:,} with a new label, group or file time)" if self.refreshed else ""),
            f"changed      {self.changed:,} paths whose content changed since they were indexed",
            f"missing      {self.missing:,} indexed paths no longer in the corpus"
            + (f", {self.removed:,} removed" if self.removed else " (--remove-missing drops them)" if self.missing
               else ""),
        ]
        if self.repaired:
            lines.append(f"repaired     {self.repaired:,} paths of damaged shards dropped and decoded again")
        note = self.decoder.summary()
        if note is not None:
            lines.append(f"decoder      {note}")
        lines.append(f"bad files    {len(self.errors):,}")
        for path, reason in sorted(self.errors.items())[:max_errors]:
            lines.append(f"  {path}: {reason}")
        if len(self.errors) > max_errors:
            lines.append(f"  ... and {len(self.errors) - max_errors} more (see the store's error table)")
        lines += [f"store size   {size}", f"wall time    {self.wall_seconds:.1f} s"]
        return "\n".join(lines)


def human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"


def dir_bytes(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                pass
    return total
