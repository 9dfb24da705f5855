"""How long a cancel of a running job takes to end it: issue 22's bar, measured.

For each engine and each repeat, a fresh ``sqlq serve`` runs one 30 s job of a built-in
kind (``sleep``: an async handler whose task is cancelled; ``cpu``: a process-pool job
that checks its stop flag); once the job is ``running``, ``DELETE /jobs/{id}`` (which
must answer 202), then ``GET`` every 5 ms until it is finished. The figure is the time
from sending the DELETE to the first GET that sees it finished, with the state and the
attempts it ended with. A timing claim, so it lives here and never in a test.

    python -m sqlq.bench.cancel_latency --out results

Writes ``cancel.jsonl`` and ``cancel.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

import msgspec

from sqlq.bench import meta
from sqlq.bench.client.http import HttpPool
from sqlq.bench.client.server import ServerProcess

KINDS = {  # a job of each kind that would run about 30 s here
    "sleep": {"work_ms": 30_000},
    "cpu": {"rounds": 60_000_000},
}
POLL_S = 0.005


async def _trial(url: str, kind: str) -> dict[str, Any]:
    async with HttpPool(url, 1) as pool:
        body = msgspec.json.encode({"kind": kind, "args": KINDS[kind]})
        status, job = await pool.json("POST", "/jobs", body)
        if status != 201:
            raise RuntimeError(f"submit answered {status}: {job}")
        path = f"/jobs/{job['id']}"
        while job["state"] != "running":
            await asyncio.sleep(POLL_S)
            _, job = await pool.json("GET", path)
        await asyncio.sleep(0.5)  # let it get going: the handler is in its work
        t0 = time.perf_counter()
        status, asked = await pool.json("DELETE", path)
        if status != 202:
            raise RuntimeError(f"DELETE of a running job answered {status}: {asked}")
        while job["state"] in ("scheduled", "running"):
            await asyncio.sleep(POLL_S)
            _, job = await pool.json("GET", path)
        seconds = time.perf_counter() - t0
    return {"kind": kind, "state": job["state"], "attempts": job["attempts_total"],
            "cancel_s": round(seconds, 4)}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engines", nargs="+", default=["walq", "sqlite"])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default=None, help="write cancel.jsonl and cancel.md here")
    a = p.parse_args()
    rows: list[dict[str, Any]] = []
    for repeat in range(a.repeats):
        for store in a.engines:
            for kind in KINDS:
                with ServerProcess.engine(store=store, workers=4) as srv:
                    row = {"store": store, "repeat": repeat, **asyncio.run(_trial(srv.url, kind))}
                print(json.dumps(row), flush=True)
                rows.append(row)
    info = meta.collect(".")
    lines = [
        "# Cancelling a running 30 s job (`python -m sqlq.bench.cancel_latency`)",
        "",
        "Produced by the script; do not edit by hand. Each row: a fresh server (`--sync "
        "full`, 4 workers), one job of the kind that would run 30 s, `DELETE` once it has "
        "run 0.5 s (answered 202), then a `GET` every 5 ms: the time from the `DELETE` to "
        "the first `GET` that sees it finished. Median [min-max] over the repeats.",
        "",
        f"- {a.repeats} repeats at commit {info['git_commit']}; Python {info['python']} on "
        f"{info['platform']}; CPU: {info['cpu']}, {info['cores']} cores",
        "",
        "| engine | kind | ended | attempts | cancel to finished, s |",
        "|---|---|---|---:|---:|",
    ]
    for store in a.engines:
        for kind in KINDS:
            group = [r for r in rows if r["store"] == store and r["kind"] == kind]
            ended = ", ".join(sorted({r["state"] for r in group}))
            attempts = ", ".join(str(n) for n in sorted({r["attempts"] for r in group}))
            s = [r["cancel_s"] for r in group]
            lines.append(f"| {store} | {kind} | {ended} | {attempts} | "
                         f"{statistics.median(s):.3f} [{min(s):.3f}-{max(s):.3f}] |")  # fmt: skip
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "cancel.jsonl").write_text("".join(json.dumps({**r, "meta": info}) + "\n"
                                                  for r in rows))  # fmt: skip
        (out / "cancel.md").write_text(text)


if __name__ == "__main__":
    main()
