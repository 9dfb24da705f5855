"""The dashboard without a browser, its pure parts: rates and percentiles, charts,
sessions on injected time, and what it ships as package data.

Its pages and actions through the ASGI app are in ``test_ui_pages.py``, the overview's
figures in ``test_ui_overview.py``; what needs a browser (the live refresh, the clicks,
layout, contrast, the cookie as a browser keeps it) is in ``test_ui_browser.py``.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from sqlq.common.clock import FakeClock
from sqlq.ui.charts import clean_span, line_chart, nice_ceiling, short
from sqlq.ui.history import History, Sample, quantile
from sqlq.ui.session import MAX_FAILURES, SESSION_S, Sessions
from tests.helpers import ROOT

INF = float("inf")
BOUNDS = (0.001, 0.01, 0.1, 1.0, INF)
TOKEN = "t0ken-for-tests"


# -- history: rates and percentiles from cumulative samples ---------------------------------


def _sample(at: float, counts: tuple[int, ...], wait: tuple[float, ...] = (0,) * 5) -> Sample:
    return Sample(at=at, counts=counts, wait=wait, run=(0,) * 5, commit=(0,) * 5)


def test_quantile_interpolates_within_a_bucket_like_prometheus() -> None:
    # 10 observations in (0.001, 0.01], 10 in (0.01, 0.1]
    assert quantile(0.5, BOUNDS, [0, 10, 10, 0, 0]) == pytest.approx(0.01)
    assert quantile(0.75, BOUNDS, [0, 10, 10, 0, 0]) == pytest.approx(0.01 + 0.09 * 0.5)
    assert quantile(0.99, BOUNDS, [0, 0, 0, 0, 5]) == 1.0  # past the last edge: that edge
    assert quantile(0.5, BOUNDS, [0, 0, 0, 0, 0]) is None


def test_rates_are_differences_between_samples_per_second() -> None:
    h = History(BOUNDS)
    h.add(_sample(10.0, (0, 0, 0, 0)))
    h.add(_sample(11.0, (100, 50, 2, 1)))
    h.add(_sample(11.0, (999, 999, 999, 999)))  # no time passed: ignored
    h.add(_sample(13.0, (300, 250, 2, 1)))
    rates = h.rates()
    assert rates["submitted"] == [(2.0, 100.0), (0.0, 100.0)]  # (seconds ago, per second)
    assert rates["dead"] == [(2.0, 1.0), (0.0, 0.0)]
    assert h.latest_rates(window_s=10) == {
        "submitted": 100.0, "completed": 250 / 3, "failed": 2 / 3, "dead": 1 / 3,
    }  # fmt: skip
    assert h.age() == 3.0


def test_percentiles_cover_only_the_window() -> None:
    h = History(BOUNDS)
    # cumulative bucket counts (le 0.001, 0.01, 0.1, 1, +Inf) since start
    h.add(_sample(0.0, (0,) * 4))
    h.add(_sample(50.0, (0,) * 4, wait=(0, 0, 0, 100, 100)))  # 100 slow ones, long ago
    h.add(_sample(100.0, (0,) * 4, wait=(0, 0, 0, 100, 100)))
    h.add(_sample(130.0, (0,) * 4, wait=(10, 20, 20, 120, 120)))  # then 10 + 10 fast
    p = h.percentiles("wait", window_s=60.0)
    assert p.count == 20
    assert p.p50 == pytest.approx(0.001)
    assert p.p99 is not None
    assert p.p99 < 0.01
    everything = h.percentiles("wait", window_s=1000.0)
    assert everything.count == 120
    assert everything.p50 is not None
    assert everything.p50 > 0.1


def test_an_empty_or_single_sample_history_has_nothing_to_say() -> None:
    h = History(BOUNDS)
    assert h.rates()["submitted"] == []
    assert h.percentiles("run").p50 is None
    h.add(_sample(1.0, (5, 5, 5, 5)))
    assert h.latest_rates()["submitted"] == 0.0
    assert h.percentiles("run").count == 0


def test_history_keeps_only_the_last_samples() -> None:
    h = History(BOUNDS, keep=3)
    for t in range(10):
        h.add(_sample(float(t), (t, 0, 0, 0)))
    assert len(h) == 3
    assert h.age() == 2.0


# -- charts ---------------------------------------------------------------------------------


def test_chart_scale_and_labels() -> None:
    assert [nice_ceiling(v) for v in (0, 0.7, 1, 3, 26, 4100)] == [1, 1, 1, 5, 50, 5000]
    assert [short(v) for v in (0, 950, 1200, 36_000, 1_500_000)] == [
        "0", "950", "1.2k", "36k", "1.5M",
    ]  # fmt: skip


def test_a_chart_draws_each_series_and_escapes_its_label() -> None:
    svg = str(line_chart(
        {"submitted": [(60.0, 10.0), (0.0, 20.0)], "dead": [(0.0, 1.0)]},
        span_s=120, unit="jobs/s", label="<b>rates</b>",
    ))  # fmt: skip
    assert svg.count("<polyline") == 1  # a series needs two points to be a line
    assert 'class="line series-submitted" points="300.0,80.0 600.0,0.0"' in svg
    assert "&lt;b&gt;rates&lt;/b&gt;" in svg
    assert "<b>" not in svg
    assert "<span>20</span>" in svg
    assert "-2 min" in svg


@pytest.mark.parametrize(
    ("span_s", "axis"),
    [(177.65, "-3 min"), (120.0, "-2 min"), (121.0, "-3 min"), (300.0, "-5 min"),
     (59.4, "-60 s"), (10.0, "-10 s")],
)  # fmt: skip
def test_the_time_axis_reads_whole_minutes_or_seconds(span_s: float, axis: str) -> None:
    """The history's age is the span: 177.65 s read "-2.96086 min" (#34); the span is
    rounded up, and the points are placed on the span the axis says."""
    svg = str(line_chart({"done": [(span_s, 1.0), (0.0, 1.0)]}, span_s=span_s, unit="jobs/s",
                         label="rates"))  # fmt: skip
    assert f"<span>{axis}</span>" in svg
    shown = clean_span(span_s)
    left = 600 * (1 - span_s / shown)
    assert f'points="{left:.1f},0.0 600.0,0.0"' in svg


# -- sessions on a fake clock ---------------------------------------------------------------


def test_a_session_cookie_is_not_the_token_and_runs_out() -> None:
    clock = FakeClock()
    s = Sessions(TOKEN, clock=clock, secret=b"k" * 32)
    assert s.required
    assert not s.valid(None)
    assert not s.valid("junk")
    assert not s.valid("1.2")
    assert s.login("wrong") is None
    cookie = s.login(TOKEN)
    assert cookie is not None
    assert TOKEN not in cookie
    assert s.valid(cookie)
    expires, mac, name = cookie.split(".")
    assert name == "admin"  # the --token's principal
    assert not s.valid(f"{int(expires) + 1}.{mac}.{name}")  # the expiry is signed
    assert not s.valid(f"{expires}.{mac}.other")  # and the name
    clock.now += SESSION_S + 1
    assert not s.valid(cookie)
    # Another token (a restart with a new --token) ends every session.
    assert not Sessions("other", clock=clock).valid(s.login(TOKEN))


def test_csrf_values_are_per_session_and_per_process() -> None:
    s = Sessions(TOKEN, clock=FakeClock(), secret=b"k" * 32)
    a, b = s.login(TOKEN), "1.x"
    assert s.csrf_ok(a, s.csrf(a))
    assert not s.csrf_ok(a, s.csrf(b))
    assert not s.csrf_ok(a, None)
    restarted = Sessions(TOKEN, clock=FakeClock(), secret=b"j" * 32)
    assert not restarted.csrf_ok(a, s.csrf(a))
    anonymous = Sessions(None, secret=b"k" * 32)
    assert anonymous.valid(None)
    assert anonymous.csrf_ok(None, anonymous.csrf("anything"))


def test_failed_logins_are_throttled_for_a_minute() -> None:
    clock = FakeClock()
    s = Sessions(TOKEN, clock=clock)
    for _ in range(MAX_FAILURES):
        assert not s.throttled()
        s.login("guess")
    assert s.throttled()
    clock.mono += 61
    assert not s.throttled()


def test_the_vendored_htmx_is_the_pinned_one() -> None:
    static = ROOT / "sqlq" / "ui" / "static"
    pinned = re.search(r"`htmx.min.js` \| htmx \| ([\d.]+) .*?`([0-9a-f]{64})`",
                       (static / "VENDORED.md").read_text())  # fmt: skip
    assert pinned, "VENDORED.md names htmx's version and hash"
    digest = hashlib.sha256((static / "htmx.min.js").read_bytes()).hexdigest()
    assert digest == pinned.group(2)
    assert f'version:"{pinned.group(1)}"' in (static / "htmx.min.js").read_text()


def test_templates_and_assets_are_package_data() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"sqlq.ui" = ["templates/*.html", "static/*"]' in pyproject
    assert any(Path(ROOT, "sqlq/ui/templates").glob("*.html"))


def test_a_workflows_graph_puts_each_job_right_of_its_parents_however_deep() -> None:
    from sqlq.common.models import State
    from sqlq.common.wire import WorkflowMember
    from sqlq.ui.graph import MAX_DRAWN, depths, graph_svg

    chain = [WorkflowMember(f"{i:032x}", "k", State.WAITING, f"s{i}",
                            (f"{i - 1:032x}",) if i else ()) for i in range(5000)]  # fmt: skip
    assert depths(chain)[f"{4999:032x}"] == 4999  # (no recursion: deeper than the stack)
    diamond = [WorkflowMember("a", "k", State.COMPLETED, "a"),
               WorkflowMember("b", "k", State.RUNNING, "b", ("a",)),
               WorkflowMember("c", "k", State.WAITING, "c", ("a",)),
               WorkflowMember("d", "k", State.WAITING, "d", ("b", "c"))]  # fmt: skip
    assert depths(diamond) == {"a": 0, "b": 1, "c": 1, "d": 2}
    svg = graph_svg(diamond, "/ui")
    assert svg is not None
    assert svg.count("<line") == 4
    assert 'class="node state-running"' in svg
    assert graph_svg(chain[: MAX_DRAWN + 1], "/ui") is None  # too many to draw: listed
