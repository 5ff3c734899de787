"""Things in progress, in all and per client address, under two caps: connections (:mod:`specstore.serving.connections`)
and clips (:class:`specstore.serving.service.Service`) are counted the same way."""

from __future__ import annotations

from collections import Counter

__all__ = ["ClientTally"]


class ClientTally:
    """``total`` in progress and ``by_client`` (client address -> count); used from the event loop's thread only."""

    def __init__(self) -> None:
        self.total = 0
        self.by_client: Counter[str] = Counter()

    def refusal(self, client: str, n: int, most: int, most_per_client: int) -> str | None:
        """Why ``n`` more from ``client`` would not fit (``"total"`` or ``"client"``), or None when they would."""
        if self.total + n > most:
            return "total"
        if self.by_client[client] + n > most_per_client:
            return "client"
        return None

    def add(self, client: str, n: int = 1) -> None:
        self.total += n
        self.by_client[client] += n

    def remove(self, client: str, n: int = 1) -> None:
        self.total -= n
        self.by_client[client] -= n
        if self.by_client[client] <= 0:
            del self.by_client[client]
