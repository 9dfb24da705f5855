"""Make ``tests/data/sqlite_vN.db`` and ``sqlite_vN.json`` with the code of schema version N.

    PYTHONPATH=/tmp/old-tree /path/to/.venv/bin/python tests/data/make_sqlite.py N

Run from outside this tree, with *that* version's code first on the path
(``tests/data/README.md`` says which commit): a migration test must open a database
exactly as users have it, written by the engine of its day. What each version writes is
``make_sqlite_vN.py``'s ``_write``; what they share is here: the check that the code on
the path is that version's (it refuses newer code), and the repacking of the file into
1 KiB pages (VACUUM, after that code closed it) so the committed file is a few KiB, the
rows as written. The JSON beside it is what was written, for the test to compare.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import shutil
import sqlite3
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# version -> a Job field that version's code does not have yet (newer code has it)
NEWER_FIELD = {"3": "snoozes", "4": "holder", "5": "cancel_forced"}


def _writer(version: str) -> Any:
    """``make_sqlite_v<version>.py``'s ``_write``, loaded from beside this file."""
    path = HERE / f"make_sqlite_v{version}.py"
    spec = importlib.util.spec_from_file_location(f"make_sqlite_v{version}", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module._write


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("version", choices=sorted(NEWER_FIELD))
    parser.add_argument("--out", type=Path, default=HERE, help="where the two files go")
    args = parser.parse_args()
    from sqlq.common.models import Job
    from sqlq.engines.sqlite.store import SCHEMA_VERSION

    if NEWER_FIELD[args.version] in Job.__struct_fields__ or SCHEMA_VERSION != args.version:
        sys.exit(f"run this with the version-{args.version} code on PYTHONPATH "
                 "(tests/data/README.md)")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        facts = asyncio.run(_writer(args.version)(Path(tmp)))
        db = Path(tmp) / "sqlq.db"
        with sqlite3.connect(db, isolation_level=None) as c:
            c.execute("PRAGMA journal_mode = delete")
            c.execute("PRAGMA page_size = 1024")
            c.execute("VACUUM")
            c.execute("PRAGMA journal_mode = wal")
        c.close()
        shutil.copyfile(db, args.out / f"sqlite_v{args.version}.db")
    text = json.dumps(facts, indent=1, sort_keys=True) + "\n"
    (args.out / f"sqlite_v{args.version}.json").write_text(text)


if __name__ == "__main__":
    main()
