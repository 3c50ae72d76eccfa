"""The one web view (``statehold report --html``, ``statehold ui``, ``location.report()``):
a self-contained HTML page (inline CSS and SVG charts, no script, nothing fetched) whose
frame, tables and charts are shared here, below every column, and whose sections come
from each kind of location: a job directory's (``tools/web_page.py``) and a Spark
checkpoint location's (``spark_checkpoints/web_page.py``). It imports nothing of
statehold, so either column can draw its own section."""

from statehold.web_page.frame import CSS, html_table, page, size, when

__all__ = ["CSS", "html_table", "page", "size", "when"]
