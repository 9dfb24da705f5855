"""D's submit phase split in two: the event loop's own work, and the wait for commits.

Runs D's `20ms-single` load (2,000 jobs of 20 ms, 32 clients, one job per POST, 16
workers, a fresh server each) on each ENGINE:SYNC named, the engines in turn within each
repeat. The server is instrumented through a `sitecustomize` this script writes to a
temporary directory: it records each group-commit batch's `_write` (start, seconds,
callers) and, on SQLite, each hop to the connection's thread (the wait for the thread to
start it, and the whole hop) and the thread's own wall and CPU time in `apply_plan`.

For the batches that began inside the submit phase (the load generator's `submit_s` from
the first batch), it prints per variant, medians over the repeats: the phase, the batches,
`write` (the sum of the batches' seconds from taking them to their durable end, the time
every caller of the batch waits) and `gap` (the sum of the times between one batch's end
and the next one's start: the loop's work on the acknowledgements and the next POSTs), and
on SQLite each component's median per batch. Run from a tree's root with its environment's
python: `python results/D-write-0753204/write.py 6 memory:full walq:full ...`.
"""

import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from sqlq.bench import meta
from sqlq.bench.experiments.base import LoadRun, compiled

SITE = """
import json, os, time, atexit
pc, tt = time.perf_counter, time.thread_time
out = os.environ["D_WRITE_OUT"]
batches, hops, applies = [], [], []
import sqlq.common.engine.groupcommit as gc
_write = gc.GroupCommitter._write
async def write(self, batch):
    t0 = pc()
    await _write(self, batch)
    batches.append((t0, pc() - t0, len(batch)))
gc.GroupCommitter._write = write
import sqlq.engines.sqlite.batch as sb
_on_thread, _apply = sb.on_thread, sb.apply_plan
async def on_thread(db, fn, *args):
    t0, began = pc(), []
    def timed(conn, *a):
        began.append(pc())
        return fn(conn, *a)
    result = await _on_thread(db, timed, *args)
    hops.append((t0, began[0] - t0, pc() - t0))
    return result
def apply_plan(conn, plan):
    t0, c0 = pc(), tt()
    try:
        return _apply(conn, plan)
    finally:
        applies.append((t0, pc() - t0, tt() - c0))
sb.on_thread, sb.apply_plan = on_thread, apply_plan
def dump():
    with open(out, "w") as f:
        json.dump({"batches": batches, "hops": hops, "applies": applies}, f)
atexit.register(dump)
"""


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else 0.0


def main() -> None:
    repeats, variants = int(sys.argv[1]), sys.argv[2:]
    compiled()
    print(json.dumps(meta.collect(tempfile.gettempdir())), flush=True)
    site = Path(tempfile.mkdtemp(prefix="d-write-"))
    (site / "sitecustomize.py").write_text(SITE)
    os.environ["PYTHONPATH"] = str(site)
    rows: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    for _ in range(repeats):
        for v in variants:
            store, sync = v.split(":")
            os.environ["D_WRITE_OUT"] = str(site / "out.json")
            run = LoadRun(experiment="D", store=store, label=v, sync=sync, jobs=2000)
            result = run.execute()
            submit = float(result["submit_s"])
            row = {"submit": submit, "cpu_us": 1e6 * float(result["server_cpu_s"]) / 2000}
            if store != "memory":
                rec = json.loads((site / "out.json").read_text())
                first = rec["batches"][0][0]
                b = [x for x in rec["batches"] if x[0] - first < submit]
                row["batches"] = len(b)
                row["write"] = sum(x[1] for x in b)
                row["gap"] = sum(b[i + 1][0] - b[i][0] - b[i][1] for i in range(len(b) - 1))
                row["write_med"] = med([x[1] for x in b])
                h = [x for x in rec["hops"] if x[0] - first < submit]
                a = [x for x in rec["applies"] if x[0] - first < submit]
                if h:
                    row["hop_med"] = med([x[2] for x in h])
                    row["hop_start_med"] = med([x[1] for x in h])
                    row["apply_wall_med"] = med([x[1] for x in a])
                    row["apply_cpu_med"] = med([x[2] for x in a])
            rows[v].append(row)
            print(json.dumps({"variant": v, **row}), flush=True)
    base = med([r["submit"] for r in rows[variants[0]]])
    print()
    print(f"medians over {repeats} repeats; x: the submit phase over {variants[0]}'s")
    for v, rs in rows.items():
        phase = med([r["submit"] for r in rs])
        line = f"{v:12} submit {phase:.3f} s ({phase / base:.2f}x)"
        line += f"  server CPU/job {med([r['cpu_us'] for r in rs]):.0f} us"
        if "write" in rs[0]:
            line += (
                f"  batches {med([r['batches'] for r in rs]):.0f}"
                f"  write {1e3 * med([r['write'] for r in rs]):.1f} ms"
                f" (each {1e3 * med([r['write_med'] for r in rs]):.2f})"
                f"  gap {1e3 * med([r['gap'] for r in rs]):.1f} ms"
            )
        if "hop_med" in rs[0]:
            line += (
                f"\n{'':12} SQLite per batch: hop {1e3 * med([r['hop_med'] for r in rs]):.2f} ms"
                f" (waiting for the thread {1e3 * med([r['hop_start_med'] for r in rs]):.2f});"
                f" on the thread {1e3 * med([r['apply_wall_med'] for r in rs]):.2f} ms wall,"
                f" {1e3 * med([r['apply_cpu_med'] for r in rs]):.2f} ms CPU"
            )
        print(line)


if __name__ == "__main__":
    main()
