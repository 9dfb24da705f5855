"""``sqlq serve --cancel-grace S --max-snoozes N``: bounded, named in the error, passed on."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from sqlq.cli import main
from sqlq.common.running import DEFAULT_MAX_SNOOZES
from sqlq.runtime.config import RuntimeConfig
from sqlq.settings import ServeSettings


def test_the_flags_reach_the_runtime_config_with_its_defaults() -> None:
    assert (RuntimeConfig().cancel_grace_s, RuntimeConfig().max_snoozes) == (10.0, 100)
    assert RuntimeConfig().progress_every_s == 1.0
    default = ServeSettings().runtime_config()
    assert (default.cancel_grace_s, default.max_snoozes) == (10.0, DEFAULT_MAX_SNOOZES)
    config = ServeSettings(cancel_grace=2.5, max_snoozes=7).runtime_config()
    assert (config.cancel_grace_s, config.max_snoozes) == (2.5, 7)


@pytest.mark.parametrize(
    ("flag", "bad"),
    [("--cancel-grace", "-1"), ("--cancel-grace", "nan"), ("--cancel-grace", "1e9"),
     ("--max-snoozes", "-1"), ("--max-snoozes", "2.5"), ("--max-snoozes", "10000000")],
)  # fmt: skip
def test_a_bad_value_is_a_cli_error_naming_the_flag(flag: str, bad: str) -> None:
    # Off loopback without a token: should the value pass, serve still refuses to start.
    args = ["serve", "--store", "memory", "--host", "0.0.0.0", flag, bad]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2, r.output[-300:]
    assert flag in r.output
    assert "Traceback" not in r.output
