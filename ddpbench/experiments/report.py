"""Reports: markdown and escaped HTML with pandas tables and matplotlib PNG plots.

:class:`Document` collects headings, text, tables and images and writes ``report.md`` and
``report.html`` together (HTML escapes everything it shows); every experiment kind renders
through it, and :func:`pyplot` gives matplotlib on the Agg backend. The kinds' own plots
live in their subpackages (``throughput/report.py`` ...).
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["Document", "pyplot"]

def pyplot() -> Any:
    """Return matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


# -- documents -------------------------------------------------------------------------------
def _md_cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return str(value).replace("|", "\\|").replace("\n", " ")


def _fmt(value: Any) -> Any:
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        if value != 0 and (abs(value) >= 1e6 or abs(value) < 1e-3):
            return f"{value:.3g}"
        return f"{value:.4g}" if abs(value) < 100 else f"{value:,.1f}"
    return value


class Document:
    """A report built once and written as markdown and as escaped HTML."""

    def __init__(self, title: str) -> None:
        self.title = title
        self._parts: list[tuple[str, Any]] = []

    def heading(self, text: str, level: int = 2) -> None:
        """Add a heading (level 2 = section)."""
        self._parts.append(("heading", (level, text)))

    def text(self, text: str) -> None:
        """Add a paragraph of plain text (`code` spans are kept)."""
        self._parts.append(("text", text))

    def bullets(self, items: Sequence[str]) -> None:
        """Add a bulleted list."""
        self._parts.append(("bullets", list(items)))

    def table(self, df: Any, *, index: bool = False, caption: str | None = None) -> None:
        """Add a pandas DataFrame as a table (floats formatted to 4 significant digits)."""
        frame = df.reset_index() if index else df
        frame = frame.map(_fmt) if hasattr(frame, "map") else frame.applymap(_fmt)
        self._parts.append(("table", (frame, caption)))

    def image(self, path: Path, alt: str) -> None:
        """Add an image (a path relative to the report folder)."""
        self._parts.append(("image", (str(path), alt)))

    def markdown(self) -> str:
        """Return the document as GitHub-flavoured markdown."""
        out = [f"# {self.title}", ""]
        for kind, value in self._parts:
            if kind == "heading":
                out += ["#" * value[0] + " " + value[1], ""]
            elif kind == "text":
                out += [value, ""]
            elif kind == "bullets":
                out += [f"- {item}" for item in value] + [""]
            elif kind == "table":
                frame, caption = value
                if caption:
                    out += [caption, ""]
                cols = [str(c) for c in frame.columns]
                out.append("| " + " | ".join(_md_cell(c) for c in cols) + " |")
                out.append("|" + "|".join("---" for _ in cols) + "|")
                for row in frame.itertuples(index=False):
                    out.append("| " + " | ".join(_md_cell(v) for v in row) + " |")
                out.append("")
            elif kind == "image":
                out += [f"![{value[1]}]({value[0]})", ""]
        return "\n".join(out)

    def html(self) -> str:
        """Return the document as a standalone HTML page; all text is escaped."""
        esc = html.escape
        body = [f"<h1>{esc(self.title)}</h1>"]
        for kind, value in self._parts:
            if kind == "heading":
                body.append(f"<h{value[0]}>{esc(value[1])}</h{value[0]}>")
            elif kind == "text":
                body.append(f"<p>{_inline_code(value)}</p>")
            elif kind == "bullets":
                items = "".join(f"<li>{_inline_code(i)}</li>" for i in value)
                body.append(f"<ul>{items}</ul>")
            elif kind == "table":
                frame, caption = value
                if caption:
                    body.append(f"<p>{_inline_code(caption)}</p>")
                body.append(frame.to_html(index=False, escape=True, na_rep="", border=0))
            elif kind == "image":
                body.append(f'<p><img src="{esc(value[0], quote=True)}" '
                            f'alt="{esc(value[1], quote=True)}"></p>')
        style = ("body{font-family:sans-serif;max-width:75em;margin:2em auto;padding:0 1em}"
                 "table{border-collapse:collapse;font-size:90%}"
                 "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}"
                 "img{max-width:100%}code{background:#f3f3f3}")
        return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">"
                f"<title>{esc(self.title)}</title><style>{style}</style></head><body>\n"
                + "\n".join(body) + "\n</body></html>\n")

    def write(self, outdir: Path) -> list[Path]:
        """Write ``report.md`` and ``report.html`` in ``outdir``; return their paths."""
        outdir.mkdir(parents=True, exist_ok=True)
        md, page = outdir / "report.md", outdir / "report.html"
        md.write_text(self.markdown(), encoding="utf-8")
        page.write_text(self.html(), encoding="utf-8")
        return [md, page]


def _inline_code(text: str) -> str:
    parts = str(text).split("`")
    return "".join(html.escape(p) if i % 2 == 0 else f"<code>{html.escape(p)}</code>"
                   for i, p in enumerate(parts))


