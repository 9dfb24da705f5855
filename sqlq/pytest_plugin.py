"""sqlq's pytest plugin: the fixture ``sqlq_testing``, an eager ``sqlq.testing.immediate()``
queue for one test.

sqlq installs it as a ``pytest11`` entry point, so a project that installs sqlq has the
fixture with nothing to configure (``-p no:sqlq.pytest_plugin`` turns it off). A module of
its own, so ``sqlq.testing`` needs no pytest (a unittest suite uses it as well), and a
test run that never asks for the fixture starts no queue and imports none of its parts.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from sqlq.testing import TestQueue


@pytest.fixture
def sqlq_testing() -> Iterator[TestQueue]:
    """Every ``.send()`` of the test runs in its own process, on the real runtime and a fake
    clock (``sqlq.testing``); eager: a send returns once its job finished. Set
    ``sqlq_testing.eager = False`` to drive the jobs yourself (a test of a cancel)."""
    from sqlq.testing import immediate

    with immediate() as q:
        yield q
