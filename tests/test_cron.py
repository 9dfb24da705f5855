"""What the cron and zone readers accept and refuse: every refusal is a ``ValidationError``
naming the field, whatever the text (the DST rules are tested through the ticks, in
test_ticks)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sqlq.common.cron import check_zone, parse_cron
from sqlq.common.errors import ValidationError

BERLIN = "Europe/Berlin"
NEW_YORK = "America/New_York"

REFUSED_CRON = [
    "0 0 * * * *", "0 0 * * * * *",  # cronsim would read a sixth field as seconds
    "@daily", "@reboot", " @hourly", "61 * * * *", "0 24 * * *", "*/0 * * * *",
    "0 0 30 2 *",  # a day that never comes
    "* * *", "", "   ", "garbage", "a b c d e", "H * * * *", "1-99999999999999999999 * * * *",
    "٣ * * * *",  # an Arabic-Indic three: int() reads it, cron does not
    "0 0 * * MON\u2003", "0\x000 * * * *",
]  # fmt: skip
REFUSED_TZ = [
    "", "../x", "../../etc/passwd", "/etc/localtime", "Europe/../Europe/Berlin", "a" * 65,
    "Nowhere/City", "America", "zone.tab", "Europe/Berlin ", "Europe/Berlin\x00", "Ünïcode/Zone",
    "Europe//Berlin", "leapseconds",
]  # fmt: skip


@pytest.mark.parametrize(
    ("check", "field", "text"),
    [(parse_cron, "cron", e) for e in REFUSED_CRON] + [(check_zone, "tz", z) for z in REFUSED_TZ],
)
def test_refused(check: Callable[[str], str], field: str, text: str) -> None:
    with pytest.raises(ValidationError) as caught:
        check(text)
    assert caught.value.field == field


@pytest.mark.parametrize(
    ("expr", "normal"),
    [("  */15  *\t* * mon ", "*/15 * * * MON"), ("0 0 L * *", "0 0 L * *"),
     ("0 9 * jan-mar MON#2", "0 9 * JAN-MAR MON#2"), ("0 0 * * 5L", "0 0 * * 5L")],
)  # fmt: skip
def test_parse_cron_normalises(expr: str, normal: str) -> None:
    assert parse_cron(expr) == normal
    assert parse_cron(normal) == normal


@pytest.mark.parametrize("tz", ["UTC", BERLIN, NEW_YORK, "Etc/GMT+5", "America/Argentina/Salta"])
def test_check_zone_accepts(tz: str) -> None:
    assert check_zone(tz) == tz


def refused_field(check: Callable[[str], str], text: str) -> str:
    """What ``check`` returns, or the field its ValidationError names (nothing else)."""
    try:
        return check(text)
    except ValidationError as exc:
        return exc.field


CRON_ALPHABET = "0123456789*/,-LW#?HJANMONSUFRI @ \t\u00a0٣"
FIVE_FIELDS = st.lists(st.text("0123456789*/,-LW#", min_size=1, max_size=8), min_size=5, max_size=5)


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=60) | st.text(CRON_ALPHABET, max_size=40) | FIVE_FIELDS.map(" ".join))
def test_parse_cron_never_raises_anything_else(expr: str) -> None:
    normal = refused_field(parse_cron, expr)
    if normal != "cron":
        assert normal == " ".join(expr.split()).upper()
        assert parse_cron(normal) == normal


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=80))
def test_check_zone_never_raises_anything_else(tz: str) -> None:
    assert refused_field(check_zone, tz) in ("tz", tz)
