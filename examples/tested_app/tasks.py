"""A small shop's background work: the jobs its checkout sends when an order is placed.

The outside world (the payment gateway, the mailer, the warehouse) is three module-level
objects the app configures at start; the tests (``test_tasks.py``) put fakes in their
place and run the tasks with ``sqlq.testing`` alone: no server, no worker, and no
sleeping through a backoff or a snooze.
"""

from __future__ import annotations

from sqlq import JobContext, Snooze, task

RESTOCK_CHECK_S = 3600.0  # an item out of stock is looked for again an hour later
EXPORT_BATCH = 100  # orders exported between two checkpoints


class GatewayDown(Exception):
    """The payment gateway did not answer: worth another attempt later."""


class Gateway:
    """The payment gateway's client (the app puts a real one here)."""

    def charge(self, order_id: int, cents: int) -> str:
        return f"ch_{order_id}_{cents}"


class Mailer:
    """Sends mail (the app puts an SMTP one here); this one keeps what it sent."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []

    def send(self, to: str, subject: str) -> None:
        self.sent.append((to, subject))


class Warehouse:
    """What is in stock, by SKU."""

    def __init__(self, stock: dict[str, int] | None = None) -> None:
        self.stock = dict(stock or {})

    def take(self, sku: str) -> bool:
        if self.stock.get(sku, 0) <= 0:
            return False
        self.stock[sku] -= 1
        return True


gateway = Gateway()
mailer = Mailer()
warehouse = Warehouse()


@task
def charge_card(order_id: int, cents: int) -> str:
    """Charge an order; the gateway being down fails the attempt, and the job is tried
    again after the server's backoff."""
    return gateway.charge(order_id, cents)


@task
def email_receipt(order_id: int, email: str) -> None:
    mailer.send(email, f"Your receipt for order {order_id}")


@task
def ship_order(order_id: int, sku: str) -> str:
    """Ship once the item is in stock; until then, look again in an hour (a snooze: no
    attempt is spent waiting for stock)."""
    if not warehouse.take(sku):
        raise Snooze(RESTOCK_CHECK_S)
    return f"order {order_id}: {sku} shipped"


@task
async def place_order(order_id: int, cents: int, email: str, sku: str) -> list[str]:
    """What the checkout route sends: the order's three jobs, each retried on its own."""
    charge = await charge_card.asend(order_id=order_id, cents=cents)
    receipt = await email_receipt.asend(order_id=order_id, email=email)
    shipping = await ship_order.asend(order_id=order_id, sku=sku)
    return [charge.id, receipt.id, shipping.id]


@task
def export_orders(ctx: JobContext, orders: int) -> int:
    """Export ``orders`` in batches; an attempt after a failure starts from the last batch
    saved, and a cancel stops it between two batches."""
    done: int = ctx.checkpoint_data or 0
    while done < orders:
        ctx.raise_if_cancelled()
        done = min(orders, done + EXPORT_BATCH)
        ctx.checkpoint(done)
        ctx.progress(100 * done / orders, f"{done} of {orders}")
    return done
