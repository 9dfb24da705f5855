"""What the dashboard's browser tests share: Chromium, a server, a page, an API client."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from sqlq.bench.client.server import ServerProcess
from tests.helpers import spawn_server, unavailable

CHROMIUM = os.environ.get("SQLQ_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"


TOKEN = "s3cret-token-for-the-ui-test"


WAIT_MS = 15_000  # the longest any page condition may take


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        unavailable(f"no chromium at {CHROMIUM} (.ci/run installs Debian's package)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


def _server(
    tmp: Path, *flags: str, env: dict[str, str] | None = None, store: str = "sqlite"
) -> ServerProcess:
    server = spawn_server(
        "--store", store, "--data", str(tmp / "data"), "--fault-injection",
        "--retry-base-ms", "1", *flags, env=env,
    )  # fmt: skip
    server.wait_ready()
    return server


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    s = _server(tmp_path)
    yield s
    s.stop()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    """A fresh browser context; fails the test on any script error or CSP violation."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    p = context.new_page()
    problems: list[str] = []
    p.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    p.on("pageerror", lambda e: problems.append(str(e)))
    expect.set_options(timeout=WAIT_MS)
    yield p
    context.close()
    assert not problems, f"the page logged errors: {problems}"


def api(server: ServerProcess, token: str | None = None) -> httpx.Client:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=server.url, headers=headers, timeout=10)


def submit(c: httpx.Client, **spec: Any) -> str:
    r = c.post("/jobs", json={"kind": "sleep", **spec})
    assert r.status_code == 201, r.text
    job_id: str = r.json()["id"]
    return job_id


def state_of(c: httpx.Client, job_id: str) -> str:
    state: str = c.get(f"/jobs/{job_id}").json()["state"]
    return state


def until(predicate: Callable[[], bool], what: str, within: float = 15.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within} s waiting for {what}")
        time.sleep(0.02)


def count(page: Page, state: str) -> int:
    return int(page.locator(f"#count-{state}").inner_text())


CONTRAST = """() => {
  const lum = c => {
    const [r, g, b] = c.match(/[\\d.]+/g).slice(0, 3).map(Number).map(v => {
      v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b;
  };
  const background = el => {
    for (; el; el = el.parentElement) {
      const bg = getComputedStyle(el).backgroundColor;
      const alpha = bg.startsWith('rgba') ? Number(bg.match(/[\\d.]+/g)[3]) : 1;
      if (alpha > 0) return bg;
    }
    return 'rgb(255, 255, 255)';
  };
  const worst = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const el = n.parentElement;
    if (!n.textContent.trim() || !el.checkVisibility() || el.closest('svg, .skip, .sr')) continue;
    const style = getComputedStyle(el);
    const [a, b] = [lum(style.color), lum(background(el))];
    const ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
    const large = parseFloat(style.fontSize) >= 24 ||
      (parseFloat(style.fontSize) >= 18.66 && Number(style.fontWeight) >= 700);
    const text = n.textContent.trim().slice(0, 30);
    if (ratio < (large ? 3 : 4.5)) worst.push(`${text}: ${ratio.toFixed(2)}`);
  }
  return worst;
}"""


def _traffic(c: httpx.Client, seconds: float) -> None:
    """Waves of jobs, some failing, each wave finished before the next: a chart's worth."""
    end = time.monotonic() + seconds
    wave = 0
    while True:
        n = 6 + 5 * (wave % 4)
        jobs = [
            submit(c, queue=("emails", "thumbnails")[i % 2], max_attempts=3,
                   args={"work_ms": 5 + i % 20, "fail_prob": 0.15})
            for i in range(n)
        ]  # fmt: skip

        def finished(js: list[str] = jobs) -> bool:
            return all(state_of(c, j) in ("completed", "dead") for j in js)

        until(finished, "a wave")
        wave += 1
        if time.monotonic() > end:
            return
