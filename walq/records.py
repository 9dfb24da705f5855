"""A change record's ops: how one commit call's changes become log bytes and back.

The writer encodes each commit call's ops on the caller's turn
(``encode_ops``) and frames a batch's calls as change records
(``change_record``); recovery decodes a record's ops into the ``Job`` and
``Transition`` changes they encode (``op_change``). ``walq.log`` owns the
framing and the record types; ``walq.store`` drives both directions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from sqlq.common.models import Job, Transition
from sqlq.common.store import Change
from sqlq.walq import log


def _op(change: Change) -> bytes:
    if isinstance(change, Job):
        return b'{"put":%s}' % msgspec.json.encode(change)
    return b'{"set":%s}' % msgspec.json.encode(change)


def encode_ops(changes: Sequence[Change]) -> bytes:
    """One commit call's ops, encoded on the caller's turn (see ``GroupCommitter``)."""
    return _op(changes[0]) if len(changes) == 1 else b",".join([_op(c) for c in changes])


def change_record(seq: int, ops: bytes) -> bytes:
    """One framed line holding one commit call's encoded ops."""
    return log.frame(b'{"seq":%d,"ops":[%s]}' % (seq, ops))


def compacted(change: Change) -> Change:
    return change.compact() if isinstance(change, Job) else change


def op_change(op: dict[str, Any]) -> Change:
    """One op of a change record as the ``Job`` or ``Transition`` it encodes."""
    return Job.from_dict(op["put"]) if "put" in op else Transition.from_dict(op["set"])
