"""The report's first screen: the findings in numbers from runs, benchmark and manifests (hand-computed), beside
the original study's claims, linked to their figures."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pretok_lib.analysis.runs import load_runs
from pretok_lib.study.findings import ORIGINAL, Finding, findings_html, study_findings

from ..analysis.helpers import simple_run

BENCH = {"methods": {"(a) per-doc tok(text) loop": {"mb_per_s": 2.0}, "(d) engine memmap w2": {"mb_per_s": 88.0},
                     "(d) engine padded w2": {"mb_per_s": 94.0}}}
STORAGE = [{"format": "memmap", "compression": None, "bytes_per_token": 2.0},
           {"format": "token-list", "compression": "zstd:22", "bytes_per_token": 0.5},
           {"format": "token-list", "compression": None, "bytes_per_token": 4.0},
           {"format": "padded", "compression": "zstd:3", "bytes_per_token": None}]   # unreadable output: left out
PREDICTION = [{"accelerator": "H100 SXM", "path": "padded", "stall_low": 0.4, "stall_high": 0.6, "stall_mid": 0.45},
              {"accelerator": "H100 SXM", "path": "padded", "stall_low": 0.1, "stall_high": 0.3, "stall_mid": 0.2},
              {"accelerator": "H100 SXM", "path": "pretok-memmap", "stall_low": 0.0, "stall_high": 0.0,
               "stall_mid": 0.0},
              {"accelerator": "A100", "path": "padded", "stall_low": 0.0, "stall_high": 0.0, "stall_mid": 0.0}]


@pytest.fixture
def runs(tmp_path: Path) -> list:
    simple_run(tmp_path, "padded", kind="padded", tokens_per_s=1000.0, eff_frac=0.5, data_stall=0.2)     # eff 500
    simple_run(tmp_path, "pf", kind="padding-free", tokens_per_s=1000.0, eff_frac=1.0, data_stall=0.1)   # eff 1000
    simple_run(tmp_path, "pp", kind="pretok-padded", tokens_per_s=1000.0, eff_frac=0.5, data_stall=0.005)
    simple_run(tmp_path, "mm", kind="pretok-memmap", tokens_per_s=1100.0, eff_frac=1.0, data_stall=0.01)  # 1100
    simple_run(tmp_path, "mm-n2", kind="pretok-memmap", tokens_per_s=1650.0, eff_frac=1.0, world_size=2,
               data_stall=0.5)
    simple_run(tmp_path, "broken", kind="padded", tokens_per_s=10.0, n=3, status="failed", error="boom")
    return load_runs(tmp_path)


def test_findings_in_numbers(runs: list) -> None:
    f = {x.key: x for x in study_findings(runs, BENCH, STORAGE, PREDICTION)}
    assert list(f) == ["tokenization", "stall", "packing", "storage", "scaling", "mfu"]
    assert f["tokenization"].value == ("pretok-memmap vs padding-free: x44 in isolation → x1.1 in training; "
                                       "pretok-padded vs padded: x47 in isolation → x1 in training")
    # measured at the smallest world size, completed runs only; predicted: best worker count on the first GPU
    assert f["stall"].value == ("measured: padded 20.0%, padding-free 10.0%, pretok-padded 0.50%, pretok-memmap "
                                "1.0%; predicted on one H100 SXM (best worker count): padded 20.0%, pretok-memmap 0%")
    assert f["stall"].figure == "stall_prediction" and "model step is slow" in f["stall"].note  # runs on CPU
    assert f["packing"].value == ("effective tokens/s padding-free / padded x2; pretok-memmap / pretok-padded x2.2; "
                                  "padded rows are 50.0% padding")
    assert f["storage"].value == "bytes/token: memmap 2, token-list 0.5 (zstd:22) – 4 (none)"
    assert f["scaling"].value == "efficiency at 2 ranks (threads per rank not recorded): pretok-memmap 75%"
    assert "not GPU scaling" in f["scaling"].note
    assert f["mfu"].value == "10.0% over 5 runs"
    assert f["packing"].original == ORIGINAL["packing"] and "75%" in f["packing"].original


def test_nothing_measured_says_so() -> None:
    f = study_findings([], None, [], [])
    assert [x.value for x in f] == [None] * 6 and f[1].figure == "data_stall"
    html = findings_html(f)
    assert html.count("not measured in this study") == 6


def test_findings_html_links_escapes_and_is_one_block() -> None:
    html = findings_html([Finding("k", "Q <1>", "v & w", "ddp_scaling", None, "cpu note")], "sub")
    assert html.startswith('<section id="findings"><h2>Findings</h2>') and html.endswith("</table></section>")
    assert "\n\n" not in html          # a blank line would end the HTML block inside a markdown cell
    assert 'href="#fig-ddp_scaling"' in html and "Q &lt;1&gt;" in html and "v &amp; w" in html
    assert 'class="finding-value">v &amp; w<br><small' in html and "no figure" in html


def test_findings_cell_of_a_study_directory(tmp_path: Path) -> None:
    from pretok_lib.study.findings import findings_cell

    simple_run(tmp_path / "runs", "sweep-padded-w1", kind="padded", tokens_per_s=1000.0, eff_frac=0.5)
    simple_run(tmp_path / "runs", "sweep-pretok-memmap-w1", kind="pretok-memmap", tokens_per_s=1100.0, eff_frac=1.0)
    simple_run(tmp_path / "runs", "train-other", kind="padded", tokens_per_s=1.0)   # not the sweep's: left out
    html = findings_cell(tmp_path, {"profile": "quick", "parameters": {"sweep_prefix": "sweep"}})
    assert "Profile quick, 2 training runs, measured on CPU" in html
    assert "pretok-memmap / pretok-padded" not in html and "padded rows are 50.0% padding" in html
    assert 'href="#fig-data_stall"' in html       # no loader benchmark: no prediction, the measured figure


@pytest.mark.parametrize("variant", [{"precision": "bf16"}, {"micro_batch": 16},
                                     {"config_extra": {"train": {"steps": 40, "precision": "fp32", "lr": 5e-3}}}])
@pytest.mark.parametrize("kind", ["padded", "pretok-memmap"])
def test_a_run_of_another_config_leaves_the_measured_stall_and_padding_alone(runs: list, tmp_path: Path, variant,
                                                                           kind: str) -> None:
    """The quick study's sweep adds precision variants of one path at world size 1 (and the full profile
    micro-batch ones): the measured stall per path and the padded share were means over those too (a bf16 run
    emulated 10x slower stalls 10x less); they are the data-path comparison's, whose group is named."""
    base = {x.key: x.value for x in study_findings(runs, BENCH, STORAGE)}
    simple_run(tmp_path, "variant", kind=kind, tokens_per_s=50.0, eff_frac=0.1, data_stall=0.9, **variant)
    more = runs + [r for r in load_runs(tmp_path) if r.run_id == "variant"]
    f = {x.key: x.value for x in study_findings(more, BENCH, STORAGE)}
    label, rest = re.fullmatch(r"\((N=1, B=4, L=64, fp32[^)]*)\) (.*)", f["stall"]).groups()
    assert rest == base["stall"], f["stall"]          # the comparison's numbers, its group named
    assert label == "N=1, B=4, L=64, fp32" + (", train.lr=0.001" if "config_extra" in variant else "")
    assert f["packing"] == base["packing"] and f["packing"].endswith("padded rows are 50.0% padding")
