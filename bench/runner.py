"""``sqlq bench``: the comparative benchmark suite.

Every run starts a fresh ``sqlq serve`` subprocess with a fresh data directory
on a free port, drives it with the load generator, and stops it. Within each
repeat the engines alternate (memory, walq, sqlite, memory, ...) so that drift
on this shared machine hits all of them alike. Each run is one JSON line in
``results/<experiment>.jsonl`` carrying the machine, versions and command.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import meta
from bench.loadgen import job_body, run_load
from bench.server import ServerProcess

STORES = ("memory", "walq", "sqlite")


@dataclass(frozen=True, kw_only=True)
class Run:
    experiment: str
    store: str
    label: str
    sync: str = "full"
    workers: int = 16
    jobs: int = 2000
    work_ms: int = 20
    fail_prob: float = 0.0
    hang_prob: float = 0.0
    kind: str = "sleep"
    rounds: int = 500_000
    concurrency: int = 32
    batch: int = 1
    rate: float = 0.0
    flags: tuple[str, ...] = ()
    drain_timeout: float = 120.0
    params: dict[str, Any] = field(default_factory=dict)

    def execute(self) -> dict[str, Any]:
        with ServerProcess(
            store=self.store, sync=self.sync, workers=self.workers, flags=self.flags
        ) as srv:
            body = job_body(self.work_ms, self.fail_prob, self.hang_prob, self.kind, self.rounds)
            result = asyncio.run(
                run_load(
                    srv.url,
                    jobs=self.jobs,
                    concurrency=self.concurrency,
                    batch=self.batch,
                    rate=self.rate,
                    body=body,
                    label=self.label,
                    drain_timeout=self.drain_timeout,
                )
            )
            result["ready_s"] = round(srv.ready_s, 4)
        return result


# -- experiments: each yields the runs of ONE repeat, engines alternating -------------


def exp_a(quick: bool, stores: tuple[str, ...], workers: tuple[int, ...] = ()) -> Iterator[Run]:
    """A. worker scaling: 2,000 x 20 ms jobs; efficiency = throughput / ideal."""
    counts = workers or ((4, 16) if quick else (1, 4, 16, 64, 256))
    jobs = 200 if quick else 2000
    for w in counts:
        for mode, conc, batch in (("single", 32, 1), ("batch", 4, 100)):
            for store in stores:
                yield Run(
                    experiment="A",
                    store=store,
                    label=f"A/{store}/w{w}/{mode}",
                    workers=w,
                    jobs=jobs,
                    concurrency=conc,
                    batch=batch,
                    params={"submit": mode, "ideal_jobs_s": w * 1000 / 20},
                )


EXPERIMENTS: dict[str, Callable[..., Iterator[Run]]] = {"A": exp_a}


def run_suite(
    *,
    only: tuple[str, ...],
    stores: tuple[str, ...],
    repeats: int,
    quick: bool,
    out: Path,
    progress: Callable[[str], None] = print,
    extra: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    out.mkdir(parents=True, exist_ok=True)
    info = meta.collect(str(out))
    rows: list[dict[str, Any]] = []
    for name in only:
        make = EXPERIMENTS[name]
        path = out / f"{name}.jsonl"
        with open(path, "w") as f:
            for repeat in range(repeats):
                for run in make(quick, stores, **(extra or {}).get(name, {})):
                    t0 = time.perf_counter()
                    row = run.execute()
                    row.update(
                        experiment=run.experiment,
                        repeat=repeat,
                        params=run.params,
                        run_s=round(time.perf_counter() - t0, 3),
                        config={
                            "workers": run.workers,
                            "sync": run.sync,
                            "jobs": run.jobs,
                            "work_ms": run.work_ms,
                            "concurrency": run.concurrency,
                            "batch": run.batch,
                            "rate": run.rate,
                            "flags": list(run.flags),
                        },
                        meta=info,
                    )
                    f.write(json.dumps(row) + "\n")
                    f.flush()
                    rows.append(row)
                    progress(
                        f"{row['label']} rep {repeat}: {row['throughput_jobs_s']} jobs/s, "
                        f"{row['completion_pct']}% done"
                    )
    return rows


def main() -> None:
    import argparse

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--only", nargs="+", default=list(EXPERIMENTS))
    p.add_argument("--stores", nargs="+", default=list(STORES))
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--workers", nargs="+", type=int, default=[])
    p.add_argument("--out", default="results")
    a = p.parse_args()
    extra = {"A": {"workers": tuple(a.workers)}} if a.workers else {}
    run_suite(
        only=tuple(a.only),
        stores=tuple(a.stores),
        repeats=a.repeats,
        quick=a.quick,
        out=Path(a.out),
        extra=extra,
    )


if __name__ == "__main__":
    main()
