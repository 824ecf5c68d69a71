"""The report's presentation helpers: long printouts and tables fold away in `<details>`, figures and short
outputs stay; figure anchors; what the notebook helpers display."""

from __future__ import annotations

import nbformat
import pandas as pd

from pretok_lib.study.present import (FOLD_LINES, FOLD_TABLE_ROWS, details_of, figure_anchor, fold_markdown_tables,
                                      fold_outputs)


def _stream(text: str, name: str = "stdout") -> dict:
    return nbformat.v4.new_output("stream", name=name, text=text)


def _html(html: str, kind: str = "display_data") -> dict:
    if kind == "execute_result":
        return nbformat.v4.new_output(kind, data={"text/html": html, "text/plain": "x"}, execution_count=3)
    return nbformat.v4.new_output(kind, data={"text/html": html})


def test_long_printouts_fold_into_one_details_block_in_order() -> None:
    long = [_stream(f"line {i}\n") for i in range(FOLD_LINES)] + [_stream("warning <x>\n", "stderr")]
    fig = _html('<div class="plotly-graph-div"></div>')
    out = fold_outputs([*long[:3], fig, *long[3:]])
    assert [o["output_type"] for o in out] == ["display_data", "display_data"]
    body = out[0]["data"]["text/html"]
    assert body.startswith("<details><summary>Printed output, 16 lines (click to show): line 0</summary>")
    assert "line 14" in body and "warning &lt;x&gt;" in body          # nothing lost, escaped
    assert out[1] is fig
    short = [_stream("a\n"), _stream("b\n")]
    assert fold_outputs(short) == short


def test_big_tables_fold_small_ones_and_figures_stay() -> None:
    big = pd.DataFrame({"a": range(FOLD_TABLE_ROWS + 1)}).to_html()
    small = pd.DataFrame({"a": range(3)}).to_html()
    out = fold_outputs([_html(big, "execute_result"), _html(small, "execute_result")])
    assert out[0]["output_type"] == "execute_result" and out[0]["execution_count"] == 3
    assert out[0]["data"]["text/html"].startswith(f"<details><summary>Table, {FOLD_TABLE_ROWS + 1} rows")
    assert out[1]["data"]["text/html"] == small
    for o in out:
        nbformat.validate(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(outputs=[o])]))


def test_markdown_tables_fold_with_blank_lines_around() -> None:
    rows = "\n".join(f"| {i} | x |" for i in range(FOLD_TABLE_ROWS + 1))
    md = f"Intro\n\n| a | b |\n|---|---|\n{rows}\n\nAfter"
    folded = fold_markdown_tables(md)
    assert folded.startswith("Intro\n\n<details><summary>Table, 11 rows (click to show)</summary>\n\n| a | b |")
    assert folded.endswith(f"| {FOLD_TABLE_ROWS} | x |\n\n</details>\n\nAfter")
    small = "| a |\n|---|\n| 1 |"
    assert fold_markdown_tables(small) == small
    out = fold_outputs([nbformat.v4.new_output("display_data", data={"text/markdown": md, "text/plain": "m"})])
    assert "<details>" in out[0]["data"]["text/markdown"] and out[0]["data"]["text/plain"] == "m"


def test_details_of_text_mapping_and_frame() -> None:
    assert "<pre" in details_of("s", "text") and details_of("s", {"a": "1", "b": "2"}).count("<details>") == 3
    assert "<table" in details_of("s", pd.DataFrame({"a": [1]}))
    assert figure_anchor("storage") == "fig-storage" and figure_anchor("storage", "01") == "fig-01-storage"
