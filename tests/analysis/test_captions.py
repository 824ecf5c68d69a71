"""Figure captions: every figure the study shows has one sentence saying what it shows; CPU notes say what CPU
runs cannot show and point to the stall prediction; folded blocks escape what they fold."""

from __future__ import annotations

from pathlib import Path

from pretok_lib.analysis.captions import (CAPTIONS, CPU_NOTES, STALL_ANCHOR, caption_html, caption_text,
                                          details_text, runs_device)
from pretok_lib.analysis.figures import all_figures
from pretok_lib.analysis.runs import load_runs

from .helpers import simple_run

STUDY_FIGURES = ("tokenize_throughput", "loader_throughput", "compression", "stall_prediction", "run_curves")


def test_every_study_figure_has_a_one_sentence_caption() -> None:
    names = set(all_figures([])) | set(STUDY_FIGURES)
    assert names <= set(CAPTIONS), names - set(CAPTIONS)
    for name, text in CAPTIONS.items():
        body = text.replace("e.g.", "eg").replace("x T(1)", "")
        assert text.endswith(".") and body.count(". ") == 0 and 40 < len(text) < 260, name
    assert set(CPU_NOTES) <= set(CAPTIONS)


def test_cpu_notes_only_for_cpu_runs_and_linked(tmp_path: Path) -> None:
    assert caption_text("ddp_scaling") == CAPTIONS["ddp_scaling"]
    cpu = caption_text("ddp_scaling", cpu=True, cpus=2)
    assert cpu.startswith(CAPTIONS["ddp_scaling"]) and "share the machine's 2 cores" in cpu
    html = caption_html("data_stall", cpu=True, cpus=2)
    assert 'class="pretok-caption"' in html and f'href="#{STALL_ANCHOR}"' in html
    assert f'href="#{STALL_ANCHOR}"' not in caption_html("data_stall")
    assert "Figure: no such." in caption_html("no_such")  # a figure without a caption still gets one
    simple_run(tmp_path, "a", tokens_per_s=10.0)   # helpers write device "cpu"
    assert runs_device(load_runs(tmp_path)) == {"cpu": True, "cpus": None}
    assert runs_device([]) == {"cpu": False, "cpus": None}


def test_details_escape_the_folded_text() -> None:
    html = details_text("a <b> summary", "x < y & </pre>")
    assert html.startswith("<details><summary>a &lt;b&gt; summary</summary>")
    assert "x &lt; y &amp; &lt;/pre&gt;" in html and html.endswith("</details>")
