"""Experiment R's peers: the judge of the marks every system's steps leave (each rule can
fail), on hand-written marks."""

from __future__ import annotations

from pathlib import Path

from sqlq.bench.flowmarks import chain, fan, final, graphs, judge, read


def _marks(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "marks"
    path.write_text("".join(f"{ln}\n" for ln in lines))
    return path


def _ran(keys: list[str], t0: float = 100.0) -> list[str]:
    """Each key started and ended in turn, 1 ms apart."""
    out, t = [], t0
    for k in keys:
        out += [f"s {k} {t:.6f}", f"e {k} {t + 0.001:.6f}"]
        t += 0.002
    return out


def test_graphs_alternate_chains_and_fans_and_name_their_last_step() -> None:
    every = graphs(2, length=3, width=2)
    assert [final(g) for g in every] == ["g0.c2", "g1.last", "g2.c2", "g3.last"]
    assert chain(0, 3) == {"g0.c0": [], "g0.c1": ["g0.c0"], "g0.c2": ["g0.c1"]}
    assert fan(1, 2)["g1.last"] == ["g1.m0", "g1.m1"]


def test_a_clean_run_has_hops_and_no_fault(tmp_path: Path) -> None:
    every = [chain(0, 3), fan(1, 2)]
    path = _marks(tmp_path, _ran([*every[0], *every[1]]))
    j = judge(every, path)
    assert (j.stuck, j.early, j.doubled, j.steps) == (0, 0, 0, 7)
    assert [round(h, 3) for h in j.hops_ms] == [1.0, 1.0]
    assert [round(f, 3) for f in j.fan_in_ms] == [1.0]


def test_each_fault_is_counted(tmp_path: Path) -> None:
    g = chain(0, 3)
    lines = _ran(["g0.c0", "g0.c1"])
    lines.insert(0, "s g0.c1 99.000000")  # c1 started before c0 ended
    lines += ["e g0.c0 101.000000", "e g0.c", "garbage"]  # c0 ended twice; torn, skipped
    j = judge([g], _marks(tmp_path, lines))
    assert (j.early, j.doubled, j.stuck) == (1, 1, 1)  # and c2 never ran: stuck
    _, ends = read(tmp_path / "marks")
    assert len(ends["g0.c0"]) == 2
    assert "g0.c" not in ends


def test_a_mark_after_a_torn_one_is_still_read(tmp_path: Path) -> None:
    path = tmp_path / "marks"
    path.write_bytes(b"e g0.c0 100.00s g0.c1 100.002000\ne g0.c1 100.003000\n")
    starts, ends = read(path)
    assert (starts, ends) == ({"g0.c1": [100.002]}, {"g0.c1": [100.003]})


def test_a_step_started_again_is_explained_only_by_a_kill_before_it(tmp_path: Path) -> None:
    g = chain(0, 1)
    path = _marks(tmp_path, ["s g0.c0 100.000000", "s g0.c0 102.000000", "e g0.c0 102.001000"])
    assert judge([g], path).unexplained == 1  # no kill: a second run is unexplained
    assert judge([g], path, killed_at=101.0).unexplained == 0  # the kill came first
    assert judge([g], path, killed_at=103.0).unexplained == 1
