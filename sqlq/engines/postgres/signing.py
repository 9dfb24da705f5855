"""The signing key of remote claims' tokens (``sqlq.common.tokens``) in shared mode: one
row of the ``secrets`` table (schema 004), so a token one node issued verifies on every
other node and after any restart.

The first node to ask makes it at random; ``INSERT ... ON CONFLICT DO NOTHING`` keeps
whatever row won, and the ``SELECT`` after it, a statement (so a snapshot) of its own,
reads that row on every node, however their first calls raced. Never logged or shown.
"""

from __future__ import annotations

import os

import asyncpg

from sqlq.common.errors import StoreError
from sqlq.common.tokens import KEY_BYTES
from sqlq.engines.postgres.queries import Q

NAME = "signing_key"  # its row's name


async def signing_key(conn: asyncpg.Connection) -> bytes:
    """The key, made now if no node made it yet. ``conn`` is outside any transaction."""
    await conn.execute(Q["add_secret"], NAME, os.urandom(KEY_BYTES))
    key = bytes(await conn.fetchval(Q["get_secret"], NAME))
    if len(key) != KEY_BYTES:
        raise StoreError(f"the stored signing key is {len(key)} bytes, not {KEY_BYTES}")
    return key
