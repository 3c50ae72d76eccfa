"""The page's frame: its style, its heading and the tables every section draws with; and
bytes and times as people read them (the CLI's tables use the same two)."""

from __future__ import annotations

from datetime import UTC, datetime
from html import escape

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;background:#fafafa}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:28px 0 8px}
.muted{color:#666} .grid-2{display:flex;flex-wrap:wrap;gap:16px}
.card{background:#fff;border:1px solid #ddd;border-radius:6px;padding:8px}
table{border-collapse:collapse;background:#fff;font-size:13px}
th,td{border:1px solid #ddd;padding:3px 8px;text-align:left}
td.num{text-align:right;font-variant-numeric:tabular-nums}
th{background:#f0f0f0} .bad{color:#c0392b} .ok{color:#3a9a5b}
.chart .grid{stroke:#e4e4e4} .chart .tick,.chart .legend{font-size:11px;fill:#555}
.chart .chart-title{font-size:13px;font-weight:600;fill:#222}
"""


def when(ts: float | None) -> str:
    """A timestamp in local time with its UTC offset (unambiguous on any machine)."""
    if not ts:
        return "-"
    return datetime.fromtimestamp(ts, UTC).astimezone().isoformat(sep=" ", timespec="seconds")


def size(n: int) -> str:
    """Bytes for people: ``812 B``, ``1.5 KiB`` ... ``3.0 TiB``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def html_table(table_id: str, headers: list[str], rows: list[list[str]], numeric: set[int]) -> str:
    """A table whose every cell is escaped (a path or a reason from storage is text, never
    markup); `numeric` columns are right-aligned."""
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(
            f'<td class="num">{escape(c)}</td>' if i in numeric else f"<td>{escape(c)}</td>"
            for i, c in enumerate(row)
        ) + "</tr>"
        for row in rows
    )
    return f'<table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def page(kind: str, uri: str, subtitle: str, sections: list[str]) -> str:
    """The whole page: the frame every kind of location shares around its own sections,
    headed by the kind and the location (`kind`, `uri` and `subtitle` are escaped here;
    `sections` are markup already)."""
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>statehold: {escape(uri)}</title><style>{CSS}</style></head>"
            f"<body><h1>{escape(kind)}: {escape(uri)}</h1>"
            f"<p class=\"muted\">{escape(subtitle)}</p>{''.join(sections)}</body></html>\n")
