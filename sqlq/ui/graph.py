"""A workflow's graph drawn on the server as SVG, as the charts are: no script, no library.

Members go in columns by depth (the longest path from a root: every parent sits in a
column left of its children), in the order they were stored within a column; an edge
is a line from a parent's right side to its child's left. Each member is a link to
its job's page, its box coloured by its state through the stylesheet's classes
(``state-<name>``), and titled with its ref, state and id for a pointer or a screen
reader. Pure: a function of the members, tested as text. A graph of more than
``MAX_DRAWN`` members is not drawn (the page lists them): a picture of thousands of
boxes says less than the counts above it.
"""

from __future__ import annotations

from collections.abc import Sequence

from markupsafe import Markup, escape

from sqlq.common.wire import WorkflowMember

MAX_DRAWN = 300
BOX_W, BOX_H = 132, 26  # a member's box
GAP_X, GAP_Y = 40, 12  # between columns, between boxes of one column
PAD = 6


def depths(members: Sequence[WorkflowMember]) -> dict[str, int]:
    """Each member's column: the longest path to it from a member with no parent among
    ``members`` (iterative, in a topological order: no graph is too deep for it)."""
    here = {m.id for m in members}
    parents = {m.id: [p for p in m.parents if p in here] for m in members}
    children: dict[str, list[str]] = {m.id: [] for m in members}
    pending = {m.id: len(parents[m.id]) for m in members}
    for m in members:
        for p in parents[m.id]:
            children[p].append(m.id)
    depth = dict.fromkeys(here, 0)
    ready = [m.id for m in members if pending[m.id] == 0]
    while ready:
        job = ready.pop()
        for child in children[job]:
            depth[child] = max(depth[child], depth[job] + 1)
            pending[child] -= 1
            if pending[child] == 0:
                ready.append(child)
    return depth


def graph_svg(members: Sequence[WorkflowMember], prefix: str) -> Markup | None:
    """The graph, or None past ``MAX_DRAWN`` members (or with none)."""
    if not members or len(members) > MAX_DRAWN:
        return None
    depth = depths(members)
    place: dict[str, tuple[float, float]] = {}
    rows: dict[int, int] = {}
    for m in members:
        column = depth[m.id]
        row = rows.get(column, 0)
        rows[column] = row + 1
        place[m.id] = (PAD + column * (BOX_W + GAP_X), PAD + row * (BOX_H + GAP_Y))
    width = PAD * 2 + (max(depth.values()) + 1) * (BOX_W + GAP_X) - GAP_X
    height = PAD * 2 + max(rows.values()) * (BOX_H + GAP_Y) - GAP_Y
    parts = [
        f'<svg class="graph" id="workflow-graph" role="img" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" '
        f'aria-label="the workflow\'s {len(members)} jobs and their edges">'
    ]
    for m in members:  # the edges first, under the boxes
        x, y = place[m.id]
        for p in m.parents:
            if p in place:
                px, py = place[p]
                parts.append(
                    f'<line class="edge" x1="{px + BOX_W}" y1="{py + BOX_H / 2}" '
                    f'x2="{x}" y2="{y + BOX_H / 2}"/>'
                )
    for m in members:
        x, y = place[m.id]
        name = m.ref or m.id[:12]
        shown = name if len(name) <= 16 else name[:15] + "\u2026"
        parts.append(
            f'<a href="{escape(prefix)}/jobs/{escape(m.id)}" class="node state-{m.state.value}">'
            f"<title>{escape(name)}: {m.state.value} ({escape(m.id)})</title>"
            f'<rect x="{x}" y="{y}" width="{BOX_W}" height="{BOX_H}" rx="4"/>'
            f'<text x="{x + 8}" y="{y + BOX_H / 2 + 4}">{escape(shown)}</text></a>'
        )
    parts.append("</svg>")
    return Markup("".join(parts))
