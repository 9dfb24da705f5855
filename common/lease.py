"""How long a holder may go on running an attempt it cannot renew: the lease on its own clock.

A lease is granted in the store, on the store's (or the granting node's) wall clock:
``lease_until = now + lease_s``, and any node may rescue the job once its own clock
passes that. A holder cut off from the store (a partition, a hung database) cannot
learn that it was rescued, so it must stop by itself before the rescue can happen,
or the job runs in two places at once for as long as the handler runs, not for as
long as the lease. The rule here is pure: a holder counts its lease from the moment
it *sent* the claim or renewal that the store granted (a grant can only have been
written after that moment, so counting from it is never late), on its monotonic
clock, and gives up ``SKEW_MARGIN`` of the lease early, for clock skew between the
nodes and for the health loop's tick.

``cut_at`` is that instant (``stop_before``, from a lease's end). Whoever holds a
lease (a node's worker pool, a remote ``sqlq worker``) calls these, so the rule has one
home.
"""

from __future__ import annotations

SKEW_MARGIN = 0.1  # of a lease: a holder stops this much before its lease can run out


def cut_at(granted_at: float, lease_s: float) -> float:
    """The instant (the holder's monotonic clock) after which a holder whose lease was last
    granted by a call sent at ``granted_at`` no longer holds the job: it stops the attempt
    and reports nothing."""
    return stop_before(granted_at + lease_s, lease_s)


def stop_before(lease_end: float, lease_s: float) -> float:
    """``cut_at`` for a holder that keeps the lease's end (``granted_at + lease_s``)."""
    return lease_end - lease_s * SKEW_MARGIN
