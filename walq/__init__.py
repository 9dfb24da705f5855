"""walq: a hand-rolled append-only JSON Lines write-ahead log engine."""

from sqlq.walq.store import WalStore

__all__ = ["WalStore"]
