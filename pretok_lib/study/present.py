"""How the study notebooks show things, so that the report reads like a paper: every figure with an anchor and a
one-sentence caption, long printouts folded away in `<details>`. The notebook helpers display; `fold_outputs`
folds the long printouts of an executed notebook when the report is assembled."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..analysis.captions import caption_html, details_html, details_text, runs_device

FOLD_LINES = 15          # printed output longer than this folds away in the report
FOLD_TABLE_ROWS = 10     # HTML tables (DataFrames) with more rows fold away too


def figure_anchor(name: str, notebook: str | None = None) -> str:
    """The HTML id of a figure: `fig-<name>` for notebook 05's figures (the findings link there), else
    `fig-<notebook>-<name>`."""
    return f"fig-{name}" if notebook is None else f"fig-{notebook}-{name}"


def show_figure(fig: Any, name: str, runs: Iterable[Any] = (), notebook: str | None = None) -> None:
    """Display `fig` under an anchor, with its caption below (and what CPU runs cannot show, when `runs` ran on
    CPU)."""
    from IPython.display import HTML, display

    dev = runs_device(runs)
    display(HTML(f'<a id="{figure_anchor(name, notebook)}"></a>'))
    fig.show()
    display(HTML(caption_html(name, dev["cpu"], dev["cpus"])))


def show_details(summary: str, body: Any) -> None:
    """Display `body` folded under `summary`: text in a `<pre>`, a DataFrame as its table, a mapping of
    name -> text as one block per name."""
    from IPython.display import HTML, display

    display(HTML(details_of(summary, body)))


def details_of(summary: str, body: Any) -> str:
    """The HTML of `show_details`."""
    if isinstance(body, str):
        return details_text(summary, body)
    if isinstance(body, Mapping):
        return details_html(summary, "\n".join(details_text(str(k), str(v)) for k, v in body.items()))
    if hasattr(body, "to_html"):
        return details_html(summary, body.to_html())
    return details_text(summary, str(body))


def _text(v: Any) -> str:
    return "".join(v) if isinstance(v, list) else str(v or "")


def fold_outputs(outputs: list[dict], max_lines: int = FOLD_LINES, max_rows: int = FOLD_TABLE_ROWS) -> list[dict]:
    """The outputs of one executed code cell with long printouts folded: its stream outputs (stdout and stderr
    merged in order) become one `<details>` block when longer than `max_lines` lines, and an HTML table
    (DataFrame) result with more than `max_rows` rows is folded likewise. Figures and short outputs are kept."""
    import nbformat

    streams = [o for o in outputs if o.get("output_type") == "stream"]
    text = "".join(_text(o.get("text")) for o in streams)
    lines = text.splitlines()
    out: list[dict] = []
    folded = False
    for o in outputs:
        if o.get("output_type") == "stream":
            if len(lines) <= max_lines:
                out.append(o)
            elif not folded:
                first = next((ln.strip() for ln in lines if ln.strip()), "output")
                more = "..." if len(first) > 80 else ""
                summary = f"Printed output, {len(lines)} lines (click to show): {first[:80]}{more}"
                out.append(_html_output(nbformat, details_text(summary, text)))
                folded = True
            continue
        data = o.get("data") or {}
        if "text/markdown" in data and "<details" not in _text(data["text/markdown"]):
            o = nbformat.from_dict({**o, "data": {**data, "text/markdown": fold_markdown_tables(
                _text(data["text/markdown"]), max_rows)}})
        table = _text(data.get("text/html"))
        rows = table.count("<tr")
        if ('class="dataframe"' in table and rows - 1 > max_rows
                and "plotly" not in table[:2000] and "<details" not in table):
            o = _html_output(nbformat, details_html(f"Table, {rows - 1} rows (click to show)", table),
                             o.get("output_type"), o.get("execution_count"))
        out.append(o)
    return out


def _html_output(nbformat: Any, body: str, kind: str | None = "display_data", count: int | None = None) -> dict:
    if kind == "execute_result":
        return nbformat.v4.new_output("execute_result", data={"text/html": body, "text/plain": "(folded)"},
                                      execution_count=count)
    return nbformat.v4.new_output("display_data", data={"text/html": body, "text/plain": "(folded)"})


def fold_markdown_tables(md: str, max_rows: int = FOLD_TABLE_ROWS) -> str:
    """`md` with each markdown table of more than `max_rows` rows wrapped in `<details>` (blank lines around
    the table keep it markdown inside the HTML block)."""
    lines, out, i = md.split("\n"), [], 0
    while i < len(lines):
        j = i
        while j < len(lines) and lines[j].lstrip().startswith("|"):
            j += 1
        if j - i - 2 > max_rows:
            out += [f"<details><summary>Table, {j - i - 2} rows (click to show)</summary>", "", *lines[i:j], "",
                    "</details>"]
            i = j
        else:
            out += lines[i:max(j, i + 1)]
            i = max(j, i + 1)
    return "\n".join(out)
