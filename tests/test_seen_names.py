"""A worker's name belongs to the principal first seen with it (``sqlq.runtime.seen``):
another principal's claim under it is refused, its reports leave the entry be, and a
name forgotten is free again."""

from __future__ import annotations

import pytest

from sqlq.common.errors import WorkerNameTaken
from sqlq.common.protocol import remote_holder
from sqlq.common.roles import Principal, Role
from sqlq.runtime.seen import WorkersSeen

MAIL = Principal("w-mail", Role.WORKER, frozenset({"mail"}))
OTHER = Principal("w-all", Role.WORKER)


def _shown(seen: WorkersSeen) -> list[tuple[str, str, float, int, list[str]]]:
    return [(w.name, w.principal, w.last_seen, w.held, w.queues) for w in seen.view().workers]


def test_another_principals_claim_under_a_name_is_refused_and_changes_nothing() -> None:
    seen = WorkersSeen()
    seen.saw("box-1", MAIL, 10.0, ["mail"])
    seen.took("box-1", 2)
    with pytest.raises(WorkerNameTaken) as taken:
        seen.saw("box-1", OTHER, 11.0, ["video"])
    assert taken.value.worker == "box-1"
    assert "w-mail" not in str(taken.value)  # whose it is is not told
    assert _shown(seen) == [("box-1", "w-mail", 10.0, 2, ["mail"])]
    seen.saw("box-2", OTHER, 12.0, ["video"])  # another name: its own
    seen.saw("box-1", MAIL, 13.0, ["mail"])  # the owner, again
    assert _shown(seen) == [
        ("box-1", "w-mail", 13.0, 2, ["mail"]),
        ("box-2", "w-all", 12.0, 0, ["video"]),
    ]


def test_another_principals_report_leaves_the_entry_be() -> None:
    seen = WorkersSeen()
    seen.saw("box-1", MAIL, 10.0, ["mail"])
    seen.saw_holder(remote_holder("box-1"), OTHER, 20.0)  # no error: a token is a capability
    assert _shown(seen) == [("box-1", "w-mail", 10.0, 0, ["mail"])]
    seen.saw_holder(remote_holder("box-1"), MAIL, 21.0)
    assert _shown(seen) == [("box-1", "w-mail", 21.0, 0, ["mail"])]
    seen.saw_holder(remote_holder("box-9"), OTHER, 22.0)  # unknown (a restart): first heard
    assert _shown(seen)[0] == ("box-9", "w-all", 22.0, 0, [])


def test_a_forgotten_name_is_free_again() -> None:
    seen = WorkersSeen(limit=1)
    seen.saw("box-1", MAIL, 10.0)
    seen.saw("box-2", MAIL, 11.0)  # box-1 is forgotten
    seen.saw("box-1", OTHER, 12.0)
    assert [(w.name, w.principal) for w in seen.view().workers] == [("box-1", "w-all")]
