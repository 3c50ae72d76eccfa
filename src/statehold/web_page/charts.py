"""Small inline SVG charts for the web view: drawn here in Python, so the page needs no
script, no library and no network. Each mark carries its exact value (``data-value``)
and a ``<title>`` tooltip, so the numbers can be read back from the page."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape

WIDTH, HEIGHT = 560, 220
LEFT, RIGHT, TOP, BOTTOM = 70, 12, 44, 34
COLORS = ("#2f6fb5", "#e08a1e", "#3a9a5b", "#8e44ad")
FAILED = "#c0392b"


@dataclass(frozen=True)
class Series:
    name: str
    values: Sequence[float]


def _scale(top: float, integer: bool) -> tuple[float, list[float]]:
    """A round upper bound at or above `top` and the grid lines up to it."""
    top = top or 1.0
    magnitude = 10 ** math.floor(math.log10(top))
    nice = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= top)
    if integer and nice < 4:
        nice = math.ceil(top)
        return nice, [float(i) for i in range(int(nice) + 1)]
    return nice, [nice * i / 4 for i in range(5)]


def _frame(
    title: str, ymax: float, fmt: Callable[[float], str], xs: Sequence[int], ticks: list[float]
) -> list[str]:
    plot_h = HEIGHT - TOP - BOTTOM
    parts = [
        f'<text x="{LEFT}" y="16" class="chart-title">{escape(title)}</text>',
    ]
    for t in ticks:
        y = TOP + plot_h - (t / ymax) * plot_h
        parts.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" '
                     'class="grid"/>')
        parts.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" class="tick" '
                     f'text-anchor="end">{escape(fmt(t))}</text>')
    if xs:
        for x_value, anchor, x in ((xs[0], "start", LEFT), (xs[-1], "end", WIDTH - RIGHT)):
            parts.append(f'<text x="{x}" y="{HEIGHT - 12}" class="tick" '
                         f'text-anchor="{anchor}">{x_value}</text>')
        parts.append(f'<text x="{(LEFT + WIDTH - RIGHT) / 2}" y="{HEIGHT - 12}" class="tick" '
                     'text-anchor="middle">checkpoint</text>')
    return parts


def _svg(chart_id: str, parts: list[str]) -> str:
    body = "".join(parts)
    return (f'<svg id="{escape(chart_id)}" class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" '
            f'width="{WIDTH}" height="{HEIGHT}" role="img" '
            f'xmlns="http://www.w3.org/2000/svg">{body}</svg>')


def _exact(v: float) -> str:
    """The number itself (a whole number as an integer, else the shortest exact repr),
    never rounded for display."""
    if isinstance(v, int):
        return str(v)
    return str(int(v)) if v.is_integer() else repr(v)


def bar_chart(
    chart_id: str,
    title: str,
    xs: Sequence[int],
    values: Sequence[float],
    fmt: Callable[[float], str],
    failed: Sequence[bool] = (),
) -> str:
    """One bar per checkpoint; failed (aborted) checkpoints in red, at least a sliver."""
    ymax, ticks = _scale(max([*values, 0]), False)
    parts = _frame(title, ymax, fmt, xs, ticks)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    step = plot_w / max(len(xs), 1)
    for i, (x, v) in enumerate(zip(xs, values, strict=True)):
        bad = i < len(failed) and failed[i]
        h = max(v / ymax * plot_h, 3.0 if bad else 0.0)
        left = LEFT + i * step + step * 0.1
        parts.append(
            f'<rect class="bar" data-x="{x}" data-value="{_exact(v)}" x="{left:.1f}" '
            f'y="{TOP + plot_h - h:.1f}" width="{max(step * 0.8, 1):.1f}" height="{h:.1f}" '
            f'fill="{FAILED if bad else COLORS[0]}"><title>checkpoint {x}: {escape(fmt(v))}'
            f'{" (aborted)" if bad else ""}</title></rect>'
        )
    return _svg(chart_id, parts)


def line_chart(
    chart_id: str,
    title: str,
    xs: Sequence[int],
    series: Sequence[Series],
    fmt: Callable[[float], str],
    *,
    step: bool = False,
    integer: bool = False,
) -> str:
    """One line per series over the checkpoints (`step`: a staircase, for epochs;
    `integer`: whole-number grid lines)."""
    ymax, ticks = _scale(max([v for s in series for v in s.values] + [0]), integer)
    parts = _frame(title, ymax, fmt, xs, ticks)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    n = len(xs)

    def at(i: int, v: float) -> tuple[float, float]:
        x = LEFT + (plot_w * (i + 0.5) / n if n else 0)
        return x, TOP + plot_h - v / ymax * plot_h

    for k, s in enumerate(series):
        color = COLORS[k % len(COLORS)]
        points: list[str] = []
        for i, v in enumerate(s.values):
            x, y = at(i, v)
            if step and points:
                points.append(f"{x:.1f},{points[-1].split(',')[1]}")
            points.append(f"{x:.1f},{y:.1f}")
        if points:
            parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" '
                         f'points="{" ".join(points)}"/>')
        for i, v in enumerate(s.values):
            x, y = at(i, v)
            parts.append(
                f'<circle class="point" data-series="{escape(s.name)}" data-x="{xs[i]}" '
                f'data-value="{_exact(v)}" cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{color}">'
                f'<title>{escape(s.name)} at checkpoint {xs[i]}: {escape(fmt(v))}</title></circle>'
            )
        lx = LEFT + k * 130
        parts.append(f'<rect x="{lx}" y="{TOP - 16}" width="10" height="3" fill="{color}"/>'
                     f'<text x="{lx + 14}" y="{TOP - 12}" class="legend">{escape(s.name)}</text>')
    return _svg(chart_id, parts)
