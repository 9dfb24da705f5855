"""results/crash.md, from the rows ``sqlq crashcheck`` and ``crashcheck_pg`` wrote."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sqlq.bench.crashcheck import READY_WITHIN_S
from sqlq.bench.crashcheck_pg import RERUN_CAUSES


def write_report(out: Path) -> str:
    """results/crash.md from every crash-*.jsonl beside it."""
    from sqlq.bench import meta

    info = meta.collect(str(out))
    lines = [
        "# Crash-recovery verification (`sqlq crashcheck`)",
        "",
        "Each trial: fresh data directory; `sqlq serve` subprocess with 16 workers; 8 clients "
        "submit 2 ms jobs and fsync every acknowledged id to a ledger; SIGKILL at a random "
        "moment (uniform 0.05-1.5 s); restart on the same data; drain; stop; then the files "
        "are verified WITHOUT the engine's code (walq: a minimal parser checking framing, "
        "CRC-32, sequence numbers and every transition's epoch fence; sqlite: stdlib sqlite3, "
        "plain SQL). For walq every third trial compacts continuously (tiny floor, ratio "
        "1.5), so kills land inside compactions. Produced by `sqlq crashcheck`; do not edit.",
        "",
        f"- machine: {info['cpu']}, {info['cores']} cores; disk {info['disk']}; "
        f"Python {info['python']}",
        "",
        "| store | sync | workload | trials | acknowledged (total) | lost | "
        "unknown (max per trial) | reruns (total) | rerun rate | restart to ready p50 s | "
        "failed trials | git commit |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    shared: list[list[dict[str, Any]]] = []
    ticking: list[list[dict[str, Any]]] = []
    remote: list[list[dict[str, Any]]] = []
    graphs: list[list[dict[str, Any]]] = []
    for path in sorted(out.glob("crash-*.jsonl")):
        rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        if not rows:
            continue
        if rows[0].get("workload") == "remote":
            remote.append(rows)
            continue
        if rows[0].get("workload") == "schedules":
            ticking.append(rows)
            continue
        if rows[0].get("workload") == "workflows":
            graphs.append(rows)
            continue
        if rows[0]["store"] == "postgres":
            shared.append(rows)
            continue
        acked = sum(r["acknowledged"] for r in rows)
        reruns = sum(r["reruns"] for r in rows)
        ready = sorted(r["restart_to_ready_s"] for r in rows)
        lines.append(
            f"| {rows[0]['store']} | {rows[0]['sync']} | {rows[0].get('workload', 'plain')} | "
            f"{len(rows)} | {acked:,} | "
            f"{sum(r['lost'] for r in rows)} | {max(r['unknown'] for r in rows)} | {reruns:,} | "
            f"{100 * reruns / acked if acked else 0:.2f}% | {ready[len(ready) // 2]:.3f} | "
            f"{_trials_tail(rows)}"
        )
    lines += [
        "",
        "`unknown`: jobs in the store that no client saw acknowledged: submissions in flight "
        "at the kill that became durable before their reply was sent (at most one per client). "
        "`reruns`: acknowledged jobs that ran more than once, because their completion was "
        "not yet durable at the kill (at-least-once delivery); in the mixed workload, counted "
        "over the jobs that cannot fail. `lost` in the mixed workload also counts jobs that "
        "ended in a way the client's story does not allow. A trial also fails if its first "
        f"restart exits or is not ready within {READY_WITHIN_S:.0f} s.",
        "",
        "The mixed workload: beside 2 ms jobs, jobs that fail at random (max_attempts 1-3), "
        "long jobs on their only attempt, hangs, delayed jobs, in two queues; an operator "
        "cancels delayed jobs, retries dead and cancelled ones, and pauses and resumes a queue "
        "during the trial. Every acknowledged job must end as the client's story allows: a "
        "cancel it saw succeed stays cancelled (unless it retried the job after), a dead job "
        "used all its attempts.",
        "",
    ]
    lines += _running_section(out)
    if shared:
        lines += _shared_section(shared)
        lines += _fair_section([rows for rows in shared if rows[0].get("workload") == "fair"])
    if ticking:
        lines += _schedules_section(ticking)
    if graphs:
        lines += _workflows_section(graphs)
    if remote:
        lines += _remote_section(remote)
    text = "\n".join(lines)
    (out / "crash.md").write_text(text)
    return text


def _running_section(out: Path) -> list[str]:
    """What the mixed trials did with what a running job carries (issue 22), so a reader
    sees the rules were exercised, not only that nothing broke them."""
    runs = []
    for path in sorted(out.glob("crash-*-mixed.jsonl")):
        rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        if rows and "running_cancels" in rows[0]:
            runs.append(rows)
    if not runs:
        return []
    lines = [
        "### What a running job carries, through the kills (mixed workload)",
        "",
        "Long jobs the operator cancels while they run (each cancel acknowledged 202 must "
        "end the job cancelled, or completed by the attempt it was asked of; walq's fold "
        "checks that no step requeued it after the request); jobs that checkpoint and fail "
        "their first attempts (the attempt that completes must have read the newest "
        "checkpoint an earlier attempt saw durable, from the handlers' fsynced ledger); jobs "
        "that snooze (they complete after exactly their snoozes, which cost no attempt).",
        "",
        "| store | trials | cancels acknowledged while running | of those, cancelled | "
        "checkpointing jobs | completed reading a checkpoint | checkpoints saw durable | "
        "snoozes | jobs with progress | jobs with errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    keys = (
        "running_cancels",
        "running_cancels_cancelled",
        "checkpoint_jobs",
        "checkpoints_read",
        "checkpoints_saved",
        "snoozes",
        "with_progress",
        "with_errors",
    )
    for rows in runs:
        sums = " | ".join(f"{sum(r.get(k, 0) for r in rows):,}" for k in keys)
        lines.append(f"| {rows[0]['store']} | {len(rows)} | {sums} |")
    return [*lines, ""]


def _shared_section(runs: list[list[dict[str, Any]]]) -> list[str]:
    """The PostgreSQL trials (``sqlq.bench.crashcheck_pg``): nodes and the database killed."""
    first = runs[0][0]
    lines = [
        "## PostgreSQL: three nodes on one database (`sqlq crashcheck --store postgres`)",
        "",
        f"Each trial: a fresh database; {first['nodes']} `sqlq serve --store postgres` nodes "
        f"(16 workers, lease {first['lease_s']} s); 8 clients submit to all of "
        "them (the plain or mixed workload above; in the mixed one an operator acts on one "
        "node at a time); one node is killed with SIGKILL at a random moment (uniform "
        "0.2-1.5 s) and started again; in every other trial PostgreSQL itself is then killed "
        "(`pg_ctl stop -m immediate`) and started again. Verified in plain SQL: every "
        "acknowledged job ended as the client's story allows (plain: completed), and every job "
        "that cannot fail and ran more than once was held by the killed node at the kill, "
        "was running when the database crashed, or is named by a node's log in an outcome it "
        "could not record or an attempt it cut off when its lease ran out unrenewed.",
        "",
        "| workload | trials | database killed in | acknowledged (total) | lost | "
        "unexplained reruns | reruns: killed node's | reruns: database crash | "
        "reruns: outcome dropped | reruns: lease lost | "
        "rescue after kill p50 / max s | failed trials | git commit |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for rows in runs:
        acked = sum(r["acknowledged"] for r in rows)
        rescue = sorted(r["rescue_s"] for r in rows if r["rescue_s"] >= 0) or [-1.0]
        db = [r for r in rows if r["db_killed"]]
        # Rows from before the logs were read have no counts of their causes: none.
        causes = {c: sum(r.get(c, 0) for r in rows) for c in RERUN_CAUSES}
        unexplained = sum(r["reruns"] for r in rows) - sum(causes.values())
        lines.append(
            f"| {rows[0].get('workload', 'plain')} | {len(rows)} | {len(db)} | {acked:,} | "
            f"{sum(r['lost'] for r in rows)} | {unexplained} | "
            f"{' | '.join(str(n) for n in causes.values())} | "
            f"{rescue[len(rescue) // 2]:.2f} / {rescue[-1]:.2f} | "
            f"{_trials_tail(rows)}"
        )
    return [
        *lines,
        "",
        "`rescue after kill`: from the SIGKILL until no job is still held by the dead node "
        "(its lease ran out and a live node requeued them).",
        "",
    ]


def _fair_section(runs: list[list[dict[str, Any]]]) -> list[str]:
    """The fair trials (``sqlq.bench.fairaudit``): what the rules held through the kill."""
    if not runs:
        return []
    first = runs[0][0]
    policy, bound = first["fair_policy"], first["fair_starts_bound"]
    lines = [
        "### A fair queue through a node's kill (`--workload fair`)",
        "",
        f"The queue's policy: `{json.dumps(policy, separators=(',', ':'))}` on every node. Half "
        "the submissions are key A's 2 ms jobs (its rate holds it back), the rest B to E's "
        "jobs of 40-120 ms (their concurrency does); key R empties and refills, as many at a "
        "time as may start at once. The database records each start, by a trigger, at the "
        "clock of the fair round that counted it; the running attempts per key under "
        "unexpired leases are sampled every 10 ms. Maxima are over every key of every trial.",
        "",
        f"| trials | starts | most in a 1 s window (bound {bound['1s']}) | most in a 10 s "
        f"window (bound {bound['10s']}) | most running of a key (limit "
        f"{policy.get('key_concurrency')}) | samples | refills | refill's wait p50 / max s | "
        "failed trials |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for rows in runs:
        waits = sorted(r["fair_refill_wait_p50_s"] for r in rows
                       if r["fair_refill_wait_p50_s"] is not None) or [-1.0]  # fmt: skip
        longest = max((r["fair_refill_wait_max_s"] or -1.0) for r in rows)
        lines.append(
            f"| {len(rows)} | {sum(r['fair_starts'] for r in rows):,} | "
            f"{max(max(r['fair_most_starts']['1s'].values()) for r in rows)} | "
            f"{max(max(r['fair_most_starts']['10s'].values()) for r in rows)} | "
            f"{max(max(r['fair_peak_running'].values(), default=0) for r in rows)} | "
            f"{sum(r['fair_samples'] for r in rows):,} | {sum(r['fair_refills'] for r in rows):,} "
            f"| {waits[len(waits) // 2]:.3f} / {longest:.3f} | "
            f"{sum(1 for r in rows if not r['ok'])} |"
        )
    return [*lines, "", "A refill must be claimed within one poll (1 s) of being due.", ""]


def _schedules_section(runs: list[list[dict[str, Any]]]) -> list[str]:
    """The schedule trials (``sqlq.bench.crashsched``)."""
    lines = [
        "## Schedules through kill -9 (`sqlq crashcheck --workload schedules`)",
        "",
        "Each trial: a fresh data directory (PostgreSQL: a fresh database and three nodes); six "
        "schedules ticking every second, five with `catch_up: all` and one with `latest`; "
        "SIGKILL at a random moment (uniform 0.5-3 s; PostgreSQL: one node); a restart that "
        "runs them on for three more ticks; every schedule paused, the queue drained, a clean "
        "stop. Verified from the files (PostgreSQL: plain SQL) without the engine's code: no "
        "tick has two jobs, no job is past its schedule's cursor, every tick up to the cursor "
        "has its job under `all`, under `latest` only ticks of the downtime are passed over, "
        "and the restarted server moved every cursor on by three ticks. The key index would "
        "refuse a second job with a tick's key, so `ticks doubled` guards the verifier's own "
        "reading; the compare-and-set is what the cursors and `lost` test.",
        "",
        "| store | sync | trials | schedule jobs (total) | ticks doubled | ticks lost | "
        "jobs ahead of a cursor | passed over by `latest` | downtime p50 s | failed trials | "
        "git commit |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for rows in runs:
        down = sorted(r["downtime_s"] for r in rows)
        lines.append(
            f"| {rows[0]['store']} | {rows[0]['sync']} | {len(rows)} | "
            f"{sum(r['ticks'] for r in rows):,} | {sum(r['doubled'] for r in rows)} | "
            f"{sum(r['missing'] + r['gone'] for r in rows)} | {sum(r['ahead'] for r in rows)} | "
            f"{sum(r['passed_over'] for r in rows)} | {down[len(down) // 2]:.2f} | "
            f"{_trials_tail(rows)}"
        )
    return [*lines, ""]


def _workflows_section(runs: list[list[dict[str, Any]]]) -> list[str]:
    """The workflow trials (``sqlq.bench.crashflow``)."""
    lines = [
        "## Workflows through kill -9 (`sqlq crashcheck --workload workflows`)",
        "",
        "Each trial: a fresh data directory; four clients submit graphs as workflows (chains "
        "of 100, diamonds, 1 -> 1,000 -> 1, random 2,000-member DAGs of short `sleep` jobs "
        "whose attempts hang now and then, cut off and retried; 2 % of members spawn 1-20 jobs "
        "as they complete, `sqlq.spawn`; in 30 % of graphs one member dies at its only "
        "attempt), and a quarter of the time add a job to one of their graphs after some of "
        "its members, and fsync each acknowledged one to a ledger; SIGKILL at a random moment "
        "(uniform 0.3-2 s); a restart; the queue drained; a clean stop. Verified from the "
        "files without the engine's code: every member there and none left live, a member "
        "after a failed parent cancelled `upstream_dead` and every other one completed (the "
        "doomed one dead), each completed member's last attempt started after its parents "
        "completed, a spawner that completed has exactly its spawned jobs (each after it, "
        "completed) and one that did not has none, and (walq, whose log keeps every step) "
        "no member released from `waiting` twice. Then a third life retries every graph with "
        "a dead member (`POST /workflows/{id}/retry`): each must drain to completed, added "
        "and spawned jobs too. On PostgreSQL two nodes share a fresh database, four clients "
        "and a ledger each; one node is killed -9 at the same random moment and started again "
        "while the other runs on; the rows are read in plain SQL and held to the same rules "
        "(rows keep no history: no release count).",
        "",
        "| store | sync | trials | graphs | jobs added | members (total) | lost | completed | "
        "dead | cancelled | spawned | graphs retried | releases seen | failed trials | "
        "git commit |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for rows in runs:

        def ended(state: str, rows: list[dict[str, Any]] = rows) -> int:
            return sum(r["ended"].get(state, 0) for r in rows)

        lines.append(
            f"| {rows[0]['store']} | {rows[0]['sync']} | {len(rows)} | "
            f"{sum(r['graphs'] for r in rows):,} | {sum(r.get('appended', 0) for r in rows):,} | "
            f"{sum(r['acknowledged'] for r in rows):,} | "
            f"{sum(r['lost'] for r in rows)} | {ended('completed'):,} | {ended('dead'):,} | "
            f"{ended('cancelled'):,} | {sum(r.get('spawned', 0) for r in rows):,} | "
            f"{sum(r.get('retried', 0) for r in rows):,} | "
            f"{sum(r['releases_seen'] for r in rows):,} | "
            f"{_trials_tail(rows)}"
        )
    return [*lines, ""]


LIVE = ("an outcome fenced while its lease held", "a heartbeat fenced while its lease held",
        "a job claimed again while a lease held")  # fmt: skip


def _remote_section(runs: list[list[dict[str, Any]]]) -> list[str]:
    """The remote-worker trials (``sqlq.bench.crashremote``, ``crashremote_pg``)."""
    lines = [
        "## Remote workers through kill -9 (`sqlq crashcheck --remote-workers`)",
        "",
        "Each trial: a fresh data directory (PostgreSQL: a fresh database, two nodes); "
        "`sqlq serve --workers 0`; three worker processes (`sqlq.bench.crashworker`) that "
        "claim, heartbeat every lease/5 and report over HTTP (batches or single outcomes at "
        "random, each kept and sent again until answered), noting both ends of every call "
        "in a side file; clients submitting a mixed workload (failures, last attempts, "
        "retry: false, checkpoints, snoozes, long jobs the operator cancels while they run, "
        "some with ?force=1, delayed jobs, retries, a paused queue); lease 5 s. Modes: "
        "`worker`, two workers holding jobs killed -9 and replaced; `server`, the server "
        "killed -9 while workers hold jobs and started again on its port (lease 10 s, longer "
        "than the restart); `fence`, 15% of "
        "jobs stall on their first attempt (no heartbeat; the outcome sent only once the "
        "lease has surely run out); `nodes` (PostgreSQL), one node and one worker killed, "
        "every call to either node at random, 10% stalls. Verified from the files (plain "
        "SQL for PostgreSQL) and the workers' records, on one clock: nothing acknowledged "
        "lost or ended wrong; every outcome sent after its lease surely ran out, or after a "
        "newer attempt was claimed, fenced (409); no outcome or heartbeat fenced, and no job "
        "claimed again, while a lease the server surely granted held; one execution per "
        "epoch; a job executed again only after an accepted requeue (failure, snooze, "
        "release), an operator's retry, or a death (the cause counted); a completed job's "
        "result is its newest attempt's.",
        "",
        "| store | mode | trials | acknowledged | lost | executions | stale outcomes sent | "
        "answered fenced | unanswered (sent again) | live leases fenced or taken | reruns: "
        "worker killed | server killed | stalled (cut off) | fenced | unexplained | outcomes "
        "landed after a restart | server down p50 / max s | failed trials | git commit |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        "---|",
    ]
    for rows in runs:

        def total(key: str, rows: list[dict[str, Any]] = rows) -> str:
            return f"{sum(r.get(key, 0) for r in rows):,}"

        live = sum(r["violations"].get(k, 0) for r in rows for k in LIVE)
        # a row from before the count: a stale send neither fenced nor a violation went
        # unanswered (every answer but fenced is one)
        unanswered = sum(r["stale_unanswered"] if "stale_unanswered" in r else
                         r["stale_outcomes"] - r["stale_fenced"] - sum(
                             v for k, v in r["violations"].items() if k.startswith("a stale"))
                         for r in rows)  # fmt: skip
        down = sorted(r["downtime_s"] for r in rows if r.get("downtime_s"))
        downtime = f"{down[len(down) // 2]:.2f} / {down[-1]:.2f}" if down else "-"
        lines.append(
            f"| {rows[0]['store']} | {rows[0]['mode']} | {len(rows)} | {total('acknowledged')} "
            f"| {total('lost')} | {total('executions')} | {total('stale_outcomes')} | "
            f"{total('stale_fenced')} | {unanswered:,} | {live} | "
            f"{total('reruns_worker_killed')} | "
            f"{total('reruns_server_killed')} | {total('reruns_cut_off')} | "
            f"{total('reruns_fenced')} | {total('reruns_unexplained')} | "
            f"{total('landed_after_restart')} | {downtime} | "
            f"{_trials_tail(rows)}"
        )
    return [
        *lines,
        "",
        "`stale outcomes sent`: sends of outcomes the records prove stale when sent; each "
        "answered must be fenced (409, or `fenced` in a batch), and one the server did not "
        "answer (it was killed, or the worker's node was) is sent again until it is. "
        "`reruns`: executions of a job after one that did not end by its own accepted "
        "outcome, by why: its worker was killed; a server died meanwhile; it stalled on "
        "purpose; it was fenced (a forced cancel). `outcomes landed after a restart`: "
        "outcomes first sent before the server's kill and accepted after its restart.",
        "",
    ]


def _trials_tail(rows: list[dict[str, Any]]) -> str:
    """The end of every section's row: its failed trials and the commits its rows ran at."""
    failed = sum(1 for r in rows if not r["ok"])
    return f"{failed} | {', '.join(sorted({r.get('git_commit', '?') for r in rows}))} |"
