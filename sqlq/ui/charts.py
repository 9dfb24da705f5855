"""Charts drawn on the server as SVG: no chart library, no script, nothing to vendor.

A chart is a pure function of its numbers, so it is tested as text and costs
the browser nothing but layout. Colours come from the stylesheet through
classes (``series-<name>``), so the page's contrast is decided in one place.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from markupsafe import Markup, escape

WIDTH, HEIGHT = 600, 160  # the plot's own units; it stretches to its box


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 times a power of ten that is at least ``value``."""
    if value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    for step in (1.0, 2.0, 2.5, 5.0):
        if step * power >= value * (1 - 1e-12):
            return step * power
    return 10.0 * power


def short(value: float) -> str:
    """A figure in at most four characters or so: 950, 1.2k, 36k, 1.5M."""
    if value >= 1e6:
        return f"{value / 1e6:.3g}M"
    if value >= 1e3:
        return f"{value / 1e3:.3g}k"
    return f"{value:.3g}"


def line_chart(
    series: Mapping[str, Sequence[tuple[float, float]]],
    *,
    span_s: float,
    unit: str,
    label: str,
) -> Markup:
    """Lines over the last ``span_s`` seconds; a point is (seconds ago, value).

    The plot stretches to its box (``preserveAspectRatio="none"``, strokes that
    do not scale), so the axis labels are HTML beside it rather than SVG text
    that would stretch with it. ``label`` is what a screen reader hears; the
    legend is the page's, as text.
    """
    span_s = clean_span(span_s)
    top = nice_ceiling(max((v for pts in series.values() for _, v in pts), default=0.0))

    def x(age: float) -> float:
        return WIDTH * (1 - min(age, span_s) / span_s)

    def y(value: float) -> float:
        return HEIGHT * (1 - value / top)

    plot = [
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" preserveAspectRatio="none" '
        'aria-hidden="true" focusable="false">'
    ]
    for frac in (0.0, 0.5, 1.0):
        gy = y(top * frac)
        plot.append(f'<line class="grid" x1="0" x2="{WIDTH}" y1="{gy:.1f}" y2="{gy:.1f}"/>')
    for name, points in series.items():
        shown = [(age, v) for age, v in points if age <= span_s]
        if len(shown) < 2:
            continue
        coords = " ".join(f"{x(age):.1f},{y(v):.1f}" for age, v in shown)
        plot.append(f'<polyline class="line series-{escape(name)}" points="{coords}"/>')
    plot.append("</svg>")
    values = "".join(f"<span>{escape(short(top * f))}</span>" for f in (1.0, 0.5, 0.0))
    return Markup(
        f'<figure class="chart-frame" role="img" aria-label="{escape(label)}">'
        f'<div class="y-axis" aria-hidden="true">{values}</div>'
        f'<div class="plot">{"".join(plot)}</div>'
        f'<div class="x-axis" aria-hidden="true"><span>-{escape(_span(span_s))}</span>'
        f"<span>now ({escape(unit)})</span></div>"
        "</figure>"
    )


def clean_span(seconds: float) -> float:
    """The chart's span, rounded up to whole minutes from two minutes (whole seconds below),
    so that its axis reads "-3 min", not the history's own age ("-2.96086 min")."""
    step = 60.0 if seconds > 120 else 1.0
    return max(step, math.ceil(seconds / step - 1e-9) * step)


def _span(seconds: float) -> str:
    return f"{seconds / 60:g} min" if seconds >= 120 else f"{seconds:.0f} s"
