"""The shop's tasks, tested as a user of sqlq tests theirs: with ``sqlq.testing`` alone.

``sqlq_testing`` (a fixture sqlq's pytest plugin provides) runs every ``.send()`` of the
test in this process, on the real runtime and a fake clock; ``sqlq.testing.context()``
calls a handler on its own.
"""

from __future__ import annotations

import pytest

import sqlq
import sqlq.testing
from sqlq.testing import TestQueue

from . import tasks
from .tasks import charge_card, email_receipt, export_orders, place_order, ship_order


class FlakyGateway(tasks.Gateway):
    """A gateway that is down for its first ``outages`` calls."""

    def __init__(self, outages: int) -> None:
        self.outages = outages

    def charge(self, order_id: int, cents: int) -> str:
        if self.outages > 0:
            self.outages -= 1
            raise tasks.GatewayDown("no answer in 10 s")
        return super().charge(order_id, cents)


@pytest.fixture(autouse=True)
def world(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh mailer and warehouse for each test, and a gateway that answers."""
    monkeypatch.setattr(tasks, "gateway", tasks.Gateway())
    monkeypatch.setattr(tasks, "mailer", tasks.Mailer())
    monkeypatch.setattr(tasks, "warehouse", tasks.Warehouse({"mug": 1}))


def test_a_receipt_is_emailed(sqlq_testing: TestQueue) -> None:
    email_receipt.send(order_id=7, email="ada@example.com").result()
    assert tasks.mailer.sent == [("ada@example.com", "Your receipt for order 7")]


def test_an_order_id_that_is_no_number_is_refused_before_it_is_sent(
    sqlq_testing: TestQueue,
) -> None:
    with pytest.raises(sqlq.Invalid) as refused:
        charge_card.send(order_id="seven", cents=100)  # type: ignore[arg-type]
    assert refused.value.field == "args.order_id"
    assert sqlq_testing.client.list().jobs == []


def test_a_charge_outlasts_a_gateway_outage(
    sqlq_testing: TestQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tasks, "gateway", FlakyGateway(outages=2))
    handle = charge_card.send(order_id=1, cents=500)
    assert handle.result() == "ch_1_500"
    job = sqlq_testing.client.get(handle.id)
    assert job.attempts == 3
    assert [e.error for e in job.errors] == ["GatewayDown: no answer in 10 s"] * 2


def test_a_charge_gives_up_after_its_last_attempt(
    sqlq_testing: TestQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tasks, "gateway", FlakyGateway(outages=100))
    handle = charge_card.options(max_attempts=3).send(order_id=2, cents=500)
    with pytest.raises(sqlq.JobError) as failed:
        handle.result()
    assert failed.value.job.state == "dead"
    assert len(failed.value.job.errors) == 3


def test_shipping_waits_for_stock_an_hour_at_a_time(sqlq_testing: TestQueue) -> None:
    sqlq_testing.eager = False  # (this test drives the clock itself)
    tasks.warehouse.stock["mug"] = 0
    handle = ship_order.send(order_id=3, sku="mug")
    sqlq_testing.advance(0)  # its first attempt: out of stock, snoozed
    job = sqlq_testing.client.get(handle.id)
    assert (job.state, job.snoozes) == ("scheduled", 1)
    tasks.warehouse.stock["mug"] = 1  # the delivery came
    sqlq_testing.advance(tasks.RESTOCK_CHECK_S)
    assert handle.result() == "order 3: mug shipped"


async def test_placing_an_order_charges_emails_and_ships(sqlq_testing: TestQueue) -> None:
    handle = await place_order.asend(order_id=4, cents=1200, email="bo@example.com", sku="mug")
    sent = await handle.result()
    jobs = [await sqlq_testing.async_client.get(job_id) for job_id in sent]
    assert [(j.kind, j.state) for j in jobs] == [
        ("charge_card", "completed"),
        ("email_receipt", "completed"),
        ("ship_order", "completed"),
    ]
    assert tasks.mailer.sent == [("bo@example.com", "Your receipt for order 4")]
    assert tasks.warehouse.stock["mug"] == 0


def test_an_export_resumes_from_its_checkpoint() -> None:
    ctx = sqlq.testing.context(checkpoint_data=200)
    assert export_orders(ctx, orders=450) == 450
    assert ctx.checkpoints == [300, 400, 450]
    assert ctx.progress_reports[-1].message == "450 of 450"


def test_an_export_stops_when_cancelled() -> None:
    ctx = sqlq.testing.context()
    ctx.cancel()
    with pytest.raises(sqlq.Cancelled):
        export_orders(ctx, orders=1000)
    assert ctx.checkpoints == []
