"""The wheel, as a user installs it: one namespace in site-packages, nothing to shadow.

The kernel, the WAL engine and the benchmarks keep their folders at the top of the
repository but install as ``sqlq.common``, ``sqlq.walq`` and ``sqlq.bench``. A user's
project with its own ``common`` and ``bench`` packages (a Django app called
``common``, say) first on ``PYTHONPATH`` must get its own, and sqlq must still run:
so this builds the wheel, installs it (not editable) in a fresh venv, and runs a
real ``sqlq serve --import`` of a module that imports the user's ``common``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import httpx
import pytest

from sqlq.bench.client.server import ServerProcess
from tests.helpers import ROOT

pytestmark = pytest.mark.slow  # a wheel build and a venv install: about half a minute

USER_TASKS = """\
import bench
import common
import sqlq
from sqlq import task


@task()
def whose(args):
    return {"common": common.WHOSE, "bench": bench.WHOSE, "sqlq": sqlq.__file__}
"""


def _pip(python: Path, *args: str, cwd: Path) -> None:
    r = subprocess.run(
        [str(python), "-m", "pip", "--disable-pip-version-check", *args],
        cwd=cwd, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, f"pip {' '.join(args)} failed:\n{r.stdout}\n{r.stderr}"


# What a build needs of the checkout; the rest stays behind. setuptools builds in the
# source tree (build/, *.egg-info): a copy keeps that out of the checkout, and a stale
# build/lib (a module since removed) out of the wheel.
NOT_BUILT = shutil.ignore_patterns(
    ".*", "build", "*.egg-info", "__pycache__", "results", "docs", "sqlq-data"
)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src, out = tmp_path_factory.mktemp("src") / "sqlq", tmp_path_factory.mktemp("wheel")
    shutil.copytree(ROOT, src, symlinks=True, ignore=NOT_BUILT)  # sqlq/common stays a link
    _pip(Path(sys.executable), "wheel", "--no-deps", "-q", "-w", str(out), str(src), cwd=out)
    (built,) = out.glob("sqlq-*.whl")
    return built


def test_the_wheel_installs_one_top_level_package(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert tops == {"sqlq"}
    # the linked folders are in it, under the namespace, with their data files
    for inside in ("sqlq/common/models.py", "sqlq/walq/log.py", "sqlq/bench/cli.py",
                   "sqlq/engines/sqlite/schema.sql", "sqlq/ui/templates/base.html"):  # fmt: skip
        assert inside in names, inside


def test_a_users_own_common_and_bench_do_not_shadow_sqlq(wheel: Path, tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)  # no system site-packages: only what the wheel needs
    python = env_dir / "bin" / "python"
    _pip(python, "install", "-q", str(wheel), cwd=tmp_path)

    user = tmp_path / "project"  # the user's project: its own common and bench
    for package in ("common", "bench"):
        (user / package).mkdir(parents=True)
        (user / package / "__init__.py").write_text(f"WHOSE = 'the user\\'s {package}'\n")
    (user / "usertasks.py").write_text(USER_TASKS)

    server = ServerProcess("--store", "memory", "--import", "usertasks", "--workers", "1",
                           env={"PYTHONPATH": str(user)})  # fmt: skip
    server.cmd = [str(env_dir / "bin" / "sqlq"), *server.cmd[3:]]  # the venv's, not ours
    try:
        server.spawn().wait_ready()
        with httpx.Client(base_url=server.url, timeout=30) as c:
            r = c.post("/jobs", json={"kind": "whose"})
            assert r.status_code == 201, r.text
            job = c.get(f"/jobs/{r.json()['id']}", params={"wait": 30}).json()
    finally:
        server.stop()
    assert job["state"] == "completed", job
    result = job["result"]
    assert (result["common"], result["bench"]) == ("the user's common", "the user's bench")
    assert Path(result["sqlq"]).is_relative_to(env_dir)  # the installed copy, not this checkout
