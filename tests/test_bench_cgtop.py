"""``sqlq.bench.cgtop``: a callgrind dump's exclusive cost, by object and function, with a
call's inclusive cost left to its callee, and the table it makes of several dumps."""

from __future__ import annotations

import gzip
from pathlib import Path

from sqlq.bench import cgtop

DUMP = """version: 1
creator: callgrind-3.19.0
events: Ir
ob=(1) /usr/lib/libpython.so
fl=(1) ceval.c
fn=(1) eval
10 300
cob=(2) /usr/lib/libsqlite3.so
cfi=(2) vdbe.c
cfn=(2) step
calls=4 0
11 5000
ob=(2)
fl=(2)
fn=(2)
20 1000
+1 200
totals: 1500
"""


def test_a_call_costs_its_callee_not_its_caller(tmp_path: Path) -> None:
    plain = tmp_path / "a.out"
    plain.write_text(DUMP)
    by_ob, by_fn = cgtop.exclusive(plain)
    assert by_ob == {"libpython.so": 300, "libsqlite3.so": 1200}
    assert by_fn == {"libpython.so:eval": 300, "libsqlite3.so:step": 1200}
    packed = tmp_path / "a.out.gz"
    packed.write_bytes(gzip.compress(DUMP.encode()))
    assert cgtop.exclusive(packed) == (by_ob, by_fn)
    text = cgtop.table([("one", plain), ("two", packed)], jobs=3, top=2)
    assert "| **total** | 500 | 500 |" in text
    assert "| `libsqlite3.so:step` | 400 | 400 |" in text
