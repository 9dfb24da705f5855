"""The stateful model test: a ``Service`` on each engine against a model of what its
clients were told (``tests/model_machine.py`` has the machine and its invariants).

The fast tier runs it on memory and walq (walq on the simulated disk that loses
power); the slow tier on every engine in the registry, PostgreSQL included,
2,000 examples in all.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from sqlq.bench.pgcluster import Cluster
from sqlq.engines.registry import ALL, ENGINES
from tests.model_machine import machine_for

FAST = ("memory", "walq")
FAST_EXAMPLES = 30  # per engine: about 2.5 s for both on a quiet machine
# Examples per engine in the slow tier: 2,000 in all, most on the durable engines (the
# memory engine is only the baseline); PostgreSQL's cost most (about 0.8 s each).
SLOW_EXAMPLES = {"memory": 200, "walq": 900, "sqlite": 700, "postgres": 200}
SLOW_STEPS = {"memory": 40, "walq": 40, "sqlite": 30, "postgres": 20}
assert sum(SLOW_EXAMPLES.values()) == 2000
assert set(SLOW_EXAMPLES) == set(ALL)


def _settings(examples: int, steps: int) -> settings:
    return settings(
        max_examples=examples,
        stateful_step_count=steps,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        report_multiple_bugs=False,
    )


@pytest.mark.timeout(300)  # a power-cut walq example is slow on a loaded machine
@pytest.mark.parametrize("engine", FAST)
def test_model_fast(engine: str) -> None:
    run_state_machine_as_test(machine_for(engine), settings=_settings(FAST_EXAMPLES, 30))


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("engine", ALL)
def test_model_every_engine(engine: str, request: pytest.FixtureRequest) -> None:
    dsn = None
    if ENGINES[engine].shared:
        cluster: Cluster = request.getfixturevalue("pg_cluster")
        db = cluster.create_database()  # emptied before each example
        dsn = lambda: db  # noqa: E731
    machine = machine_for(engine, dsn)
    examples, steps = SLOW_EXAMPLES[engine], SLOW_STEPS[engine]
    run_state_machine_as_test(machine, settings=_settings(examples, steps))
