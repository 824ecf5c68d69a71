"""What the study's reader sees first (issue 36 items 1 and 7): a study that failed says so on the report's first
screen, a finding not measured says why, and pretok's own benchmark targets ("[FAIL] engine start-up ... (need <=
0.3)") stay out of the user's notebooks, labelled as the tool's self-check where they are shown."""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pretok_lib.study.findings import failure_html, findings_cell, measured_text
from pretok_lib.study.run import NOTEBOOK_DIR
from pretok_lib.study.selfcheck import LABEL, quiet_targets, self_check_rows

_PLAIN = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r\x0b\x0c\x1c\x1d\x1e\x85"
                               "\u2028\u2029"), max_size=20).filter(lambda t: not t.lstrip().startswith("["))
_TARGET = st.builds(lambda s, t: f"  [{s}] {t}", st.sampled_from(["PASS", "FAIL", "info", "N/A"]), _PLAIN)


@settings(max_examples=150, deadline=None)
@given(lines=st.lists(st.one_of(_PLAIN.map(lambda t: (t, False)), _TARGET.map(lambda t: (t, True))), max_size=12),
       cut=st.integers(1, 7))
def test_target_lines_are_held_back_and_every_other_line_passes_in_order(lines, cut) -> None:
    """Any mix of printed lines, written in pieces of any size: the target lines are held back (kept, stripped),
    every other line reaches the notebook's output unchanged and in order."""
    import io

    text = "".join(t + "\n" for t, _ in lines)
    out = io.StringIO()
    real, sys.stdout = sys.stdout, out
    try:
        with quiet_targets() as held:
            for i in range(0, len(text), cut):
                sys.stdout.write(text[i:i + cut])
    finally:
        sys.stdout = real
    assert out.getvalue() == "".join(t + "\n" for t, target in lines if not target)
    assert held == [t.strip() for t, target in lines if target]


def test_notebook_02_shows_the_targets_only_as_the_tools_self_check() -> None:
    nb = nbformat.read(str(NOTEBOOK_DIR / "02_loader_benchmark.ipynb"), as_version=4)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert 'pd.DataFrame(res["targets"])' not in code and "self_check_rows" in code and "LABEL" in code
    assert "## Targets" not in "\n".join(c.source for c in nb.cells)
    rows = self_check_rows([{"target": "engine start-up", "value": 0.9, "need": "<= 0.3", "pass": False}])
    assert rows == [{"pretok self-check": "engine start-up", "value": 0.9, "pretok needs": "<= 0.3",
                     "pretok check": "FAIL"}]
    assert "not about your data" in LABEL


@settings(max_examples=60, deadline=None)
@given(status=st.sampled_from(["failed", "stopped", "running"]), error=st.text(max_size=300))
def test_a_study_that_did_not_finish_says_so_first(tmp_path_factory, status: str, error: str) -> None:
    """The report of a study whose notebook failed opened with "(0 s)" and "not measured" findings, the error far
    below: the findings block now opens with which notebook did not finish and its error (escaped, one line, so the
    block stays one HTML block)."""
    import html

    out = tmp_path_factory.mktemp("s")
    record = {"profile": "quick", "parameters": {}, "notebooks": {
        "01_pretokenize": {"status": status, "error": error}}}
    cell = findings_cell(out, record)
    banner = failure_html(record)
    assert banner and banner in cell and cell.index(banner) < cell.index('<p class="machine"') < cell.index("<table")
    assert "\n" not in banner and "01_pretokenize" in banner and "did not finish" in banner
    assert html.escape(" ".join(error.split())) in banner


def test_a_study_that_finished_has_no_alarm(tmp_path: Path) -> None:
    record = {"profile": "quick", "parameters": {}, "notebooks": {
        n: {"status": "completed", "seconds": 1.0} for n in ("01_pretokenize", "02_loader_benchmark")}}
    assert failure_html(record) == "" and "study-failed" not in findings_cell(tmp_path, record)


@pytest.mark.parametrize("reason,shown", [("not measured", "X: not measured"),
                                          ("skipped: sentencepiece", "X: not measured — skipped: sentencepiece")])
def test_a_finding_not_measured_says_why(reason: str, shown: str) -> None:
    assert measured_text({"question": "X", "value": None, "reason": reason}) == shown
