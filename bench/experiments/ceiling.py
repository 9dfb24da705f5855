"""The client's ceiling: the load generator against a trivial endpoint on the same stack.

If the client could not outrun the server, every submit rate in the report
would measure the client. A bare ASGI app (``sqlq.bench.trivial``) on the same
uvicorn/uvloop/httptools stack shows how fast the client can go.
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import uvloop

from sqlq.bench.client.loadgen import job_body, run_load
from sqlq.bench.client.server import free_port
from sqlq.bench.experiments.base import BenchRun
from sqlq.bench.experiments.rows import Latency, LoadRow, Row
from sqlq.bench.report import Report, cell, med

NAME = "ceiling"
LOAD_EXPERIMENTS = ("A", "B", "C", "D", "I")  # whose submit rates the ceiling must exceed


class CeilingRow(Row, kw_only=True):
    requests: int
    ceiling_req_s: float
    submit_latency: Latency


ROW = CeilingRow


@dataclass(frozen=True, kw_only=True)
class CeilingRun:
    experiment: str = NAME
    store: str = "trivial"
    label: str = "ceiling/trivial-endpoint"
    requests: int = 20_000
    params: dict[str, Any] = field(default_factory=dict)

    def execute(self) -> dict[str, Any]:
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "sqlq.bench.trivial", str(port)])
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.perf_counter() + 30
            while time.perf_counter() < deadline:
                try:
                    urllib.request.urlopen(urllib.request.Request(url + "/jobs", b"{}"), timeout=1)
                    break
                except OSError:
                    time.sleep(0.02)
            r = uvloop.run(
                run_load(
                    url,
                    jobs=self.requests,
                    concurrency=32,
                    body=job_body(20, 0, 0, "sleep", 0),
                    drain=False,
                )
            )
        finally:
            proc.terminate()
            proc.wait()
        return {
            "label": self.label,
            "store": "trivial",
            "requests": self.requests,
            "ceiling_req_s": r["submit_rate_req_s"],
            "submit_latency": r["submit_latency"],
        }


def runs(quick: bool, stores: tuple[str, ...]) -> Iterator[BenchRun]:
    yield CeilingRun(requests=2_000 if quick else 20_000)


def section(rep: Report) -> None:
    from sqlq.bench.experiments.h_latency import LatencyRow

    rows = rep.rows(NAME, CeilingRow)
    if not rows:
        return
    ceil = med(r.ceiling_req_s for r in rows)
    rates = [
        (r.submit_rate_req_s, r.label) for name in LOAD_EXPERIMENTS for r in rep.rows(name, LoadRow)
    ]
    rates += [(p.submit_rate_req_s, r.label) for r in rep.rows("H", LatencyRow) for p in r.points]
    highest, where = max(rates, default=(0.0, ""))
    rep.add(
        "## The client's ceiling",
        "",
        "The same load generator (its own minimal client, 32 keep-alive connections) "
        "against a trivial endpoint, a bare ASGI app on the same uvicorn/uvloop/httptools "
        f"stack that reads the body and answers 201: **{ceil:,.0f} requests/s** "
        f"({cell([r.ceiling_req_s for r in rows])}). The highest submit rate measured "
        f"against sqlq in this run was {highest:,.0f} requests/s ({where}), so the "
        f"ceiling is {ceil / highest if highest else float('nan'):.2f}x it.",
        "",
    )
    if highest:
        rep.check(
            "client ceiling >= 1.5x the highest submit rate",
            f"{ceil / highest:.2f}x",
            ceil >= 1.5 * highest,
            "bar 1.5x",
        )
