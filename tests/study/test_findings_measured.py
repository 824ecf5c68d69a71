"""study.json's machine-readable findings and the first screen built from them: intervals and n from repeated
runs, "not resolved" where the interval holds no effect, impossible values as invalid measurements naming their
runs (never shown as a finding), and whether the machine was quiet."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pretok_lib.analysis.runs import load_runs
from pretok_lib.study.findings import findings_cell, findings_html, study_findings
from pretok_lib.study.measured import measured_findings, merge_machines, paired_samples

from ..analysis.helpers import simple_run

KEYS = {"id", "question", "value", "unit", "interval", "n", "resolved", "valid", "reason"}


def _repeated(root: Path, rates: dict[str, list[float]], eff: dict[str, float], ws: int = 1, tag: str = "") -> None:
    for kind, rs in rates.items():
        for k, r in enumerate(rs):
            simple_run(root, f"{kind}{tag}-r{k}", kind=kind, tokens_per_s=r, eff_frac=eff.get(kind, 1.0),
                       world_size=ws, data_stall=0.01 * (k + 1))


def test_repeated_runs_give_intervals_and_resolve_a_clear_packing_gain(tmp_path: Path) -> None:
    _repeated(tmp_path, {"padded": [1000, 1100, 900], "padding-free": [1000, 1080, 950]}, {"padded": 0.5})
    fs = {f["id"]: f for f in measured_findings(load_runs(tmp_path), None)}
    assert all(KEYS <= f.keys() for f in fs.values())
    pack = fs["packing.padding-free"]
    # paired by repeat suffix: 1000/500, 1080/550, 950/450
    assert pack["value"] == pytest.approx(2.0) and pack["n"] == 3
    assert pack["interval"] == pytest.approx([1080 / 550, 950 / 450]) and pack["resolved"] and pack["valid"]
    stall = fs["stall.padded"]
    assert stall["value"] == pytest.approx(0.02) and stall["interval"] == pytest.approx([0.01, 0.03])
    assert fs["tokenization.isolated"]["value"] is None and fs["tokenization.isolated"]["n"] == 0


def test_an_effect_within_the_noise_is_not_resolved(tmp_path: Path) -> None:
    _repeated(tmp_path, {"padded": [1000, 1000, 1000], "padding-free": [450, 520, 560]}, {"padded": 0.5})
    pack = {f["id"]: f for f in measured_findings(load_runs(tmp_path), None)}["packing.padding-free"]
    assert pack["interval"][0] < 1 < pack["interval"][1] and pack["resolved"] is False and pack["valid"]
    assert pack["reason"].startswith("not resolved at this noise (±") and "repeats would resolve it" in pack["reason"]


@pytest.mark.parametrize("speedup", [1.77, 3.51, 1.06, 0.9])
def test_a_scaling_efficiency_above_one_is_an_invalid_measurement_never_a_finding(tmp_path: Path,
                                                                                  speedup: float) -> None:
    """The demo's 177-351% "efficiency" (2 ranks vs 1): invalid, naming the runs, and the first screen shows no
    efficiency number as a finding for it."""
    simple_run(tmp_path, "mm-w1", kind="pretok-memmap", tokens_per_s=1000.0, eff_frac=1.0)
    simple_run(tmp_path, "mm-w2", kind="pretok-memmap", tokens_per_s=2000.0 * speedup, eff_frac=1.0, world_size=2)
    runs = load_runs(tmp_path)
    f = {x["id"]: x for x in measured_findings(runs, None)}["scaling.pretok-memmap"]
    assert f["valid"] is (speedup <= 1.05) and (f["resolved"] is False or f["valid"])
    html = findings_html(study_findings(runs, None, []), measured=list(measured_findings(runs, None)))
    row = html.split('data-key="scaling"')[1].split("</tr>")[0]
    if not f["valid"]:
        assert "invalid measurement: scaling efficiency" in row and "mm-w2" in row
        assert "efficiency at 2 ranks" not in row       # the legacy number is not published beside it


def test_isolated_speedup_from_the_benchmark_rounds_and_below_one_is_invalid() -> None:
    def bench(samples: list[float]) -> dict:
        xs = sorted(samples)
        return {"repeats": {"ratios": {"isolated tokenization speedup: e / l": {
            "median": xs[1], "interval": [xs[0], xs[-1]], "n": 3, "coverage": 0.75, "samples": xs}}}}

    ok = measured_findings([], bench([40.0, 44.0, 47.0]))[0]
    assert ok["value"] == 44.0 and ok["interval"] == [40.0, 47.0] and ok["resolved"] and ok["valid"]
    bad = measured_findings([], bench([0.37, 0.38, 0.4]))[0]
    assert bad["valid"] is False and "slower in isolation" in bad["reason"] and "3 rounds" in bad["reason"]


def test_pairing_by_repeat_suffix_else_ratio_of_means() -> None:
    vals = {"a-r0": 2.0, "a-r1": 4.0, "b-r0": 1.0, "b-r1": 1.0, "c": 3.0, "d": 1.5}
    assert paired_samples(["a-r0", "a-r1"], ["b-r0", "b-r1"], vals) == [2.0, 4.0]
    assert paired_samples(["c"], ["d"], vals) == [2.0] and paired_samples(["c"], [], vals) == []


def test_the_first_screen_says_whether_the_machine_was_quiet(tmp_path: Path) -> None:
    simple_run(tmp_path / "runs", "sweep-padded-w1", kind="padded", tokens_per_s=1000.0, eff_frac=0.5)
    (tmp_path / "bench").mkdir()
    noisy = {"quiet": False, "calibration_drift": 0.4, "outside_cpu_cores": 1.2, "loadavg": 3.0, "steal": 0.0,
             "probed_runs": 6, "flagged": [{"run": "(c) ceiling 2 cores#1", "reasons": ["x"]}]}
    (tmp_path / "bench" / "tokenize.json").write_text(json.dumps({"methods": {}, "machine": noisy}))
    html = findings_cell(tmp_path, {"profile": "quick", "parameters": {"sweep_prefix": "sweep"}})
    assert 'data-quiet="false"' in html and "NOT quiet" in html and "1.20 cores" in html and "ceiling 2 cores#1" in html
    quiet = merge_machines([{**noisy, "quiet": True, "flagged": []}, None])
    assert quiet["quiet"] is True and "was quiet" in findings_html([], machine=quiet)
    assert merge_machines([])["quiet"] is None and "not probed" in findings_html([])


def test_study_sweep_repeats_are_interleaved_rotated_and_suffixed() -> None:
    """Training repeats for the study: every point once per round, the order rotated, ids -r<k> (what the
    findings pair by); one repeat leaves the points and their ids as they were."""
    from pretok_lib.launch.sweep import expand_grid
    from pretok_lib.study.steps import repeated_points

    pts = expand_grid({"train.steps": 5}, {"data.kind": ["padded", "padding-free", "pretok-memmap"]})
    assert repeated_points(pts, 1) == pts and all(not p.run_id.endswith("-r0") for p in pts)
    reps = repeated_points(pts, 3)
    ids = [p.run_id for p in reps]
    assert len(set(ids)) == 9 and all(i.endswith(f"-r{k // 3}") for k, i in enumerate(ids))
    kinds = [p.get("data.kind") for p in reps]
    assert kinds[:3] == ["padded", "padding-free", "pretok-memmap"] and kinds[3:6] == kinds[1:3] + kinds[:1]
    assert all(kinds[i] != kinds[i + 1] for i in range(8))      # never the same point back to back
    assert reps[4].cli_overrides() == pts[2].cli_overrides()    # the same config: a repeat, not a variant


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=5))
def test_per_point_repeats_run_each_point_its_count_interleaved(counts: list[int]) -> None:
    """A grid's own `repeats` (the quick profile repeats its world-1 paths only): each point runs exactly its
    count, in rounds (a point's k-th run after every point's (k-1)-th), never back to back while another point
    has runs left in the round, ids -r<k> only on the points that repeat."""
    from pretok_lib.launch.sweep import expand_grid
    from pretok_lib.study.steps import repeated_points

    pts = expand_grid({"train.steps": 5}, {"train.seed": list(range(len(counts)))})
    per = {p.run_id: c for p, c in zip(pts, counts)}
    reps = repeated_points(pts, 1, per)
    base = {p.run_id: p for p in pts}
    seen: dict[str, int] = {}
    for r in reps:
        key = r.run_id.rsplit("-r", 1)[0] if r.repeat is not None else r.run_id
        assert r.repeat == (seen.get(key, 0) if per[key] > 1 else None)
        assert r.cli_overrides() == base[key].cli_overrides()
        seen[key] = seen.get(key, 0) + 1
        assert all(v >= seen[key] - 1 for k, v in seen.items() if per[k] >= seen[key])   # rounds, not blocks
    assert seen == per and len({r.run_id for r in reps}) == sum(counts)


def test_a_grid_repeats_key_sets_its_points_repeats_and_is_not_an_axis() -> None:
    from pretok_lib.study.steps import point_repeats, sweep_points

    index = {"tokenizer": "t", "seq_len": 16, "paths": {k: f"/d/{k}" for k in
                                                       ("padded", "padding-free", "pretok-memmap")},
             "eval": {"pretok-memmap": "/h/memmap", "pretok-padded": "/h/padded-zstd3"}}
    grids = [{"data": ["padded", "pretok-memmap"], "world": [1], "repeats": 3}, {"data": ["pretok-memmap"],
                                                                                 "world": [1, 2]}]
    pts = sweep_points(index, grids, {}, "sweep")
    per = point_repeats(index, grids, {}, "sweep", 1)
    assert len(pts) == 3 and all("repeats" not in p.run_id for p in pts)
    assert sorted(per.values()) == [1, 3, 3]      # the shared memmap w1 point: the most of its grids


@pytest.mark.parametrize("n", range(1, 7))
def test_a_run_too_short_to_measure_gives_no_number_and_is_named(tmp_path: Path, n: int) -> None:
    """Issue 34: a 1-rank run with 2 measured steps after the warm-up (2 records skipped) gave the scaling
    efficiency its base. Below MIN_MEASURED_STEPS it joins no finding (first screen nor study.json) and the first
    screen names it."""
    from pretok_lib.study.measured import MIN_MEASURED_STEPS, split_measurable

    runs_dir = tmp_path / "runs"
    simple_run(runs_dir, "sweep-mm-w1", kind="pretok-memmap", tokens_per_s=1000.0, eff_frac=1.0, n=n, data_stall=0.5)
    simple_run(runs_dir, "sweep-mm-w2", kind="pretok-memmap", tokens_per_s=1800.0, eff_frac=1.0, world_size=2)
    runs = load_runs(runs_dir)
    short = n - 2 < MIN_MEASURED_STEPS      # simple_run's runs skip 2 warm-up records
    assert split_measurable(runs)[1] == (["sweep-mm-w1"] if short else [])
    fs = {f["id"]: f for f in measured_findings(runs, None)}
    assert ("scaling.pretok-memmap" in fs) is not short
    stalls = [f["value"] for k, f in fs.items() if k.startswith("stall.")]
    assert (0.5 in stalls) is not short
    screen = {f.key: f.value for f in study_findings(runs, None, [])}
    assert (screen["scaling"] is None) is short
    html = findings_cell(tmp_path, {"profile": "quick", "parameters": {"sweep_prefix": "sweep"}})
    assert ("too short to measure" in html and "sweep-mm-w1" in html.split("too short")[1]) is short


@pytest.mark.parametrize("threads", [(2, 1), (1, 1), (4, 4), (None, 1)])
def test_the_scaling_finding_states_threads_per_rank_and_unequal_threads_are_invalid(tmp_path: Path,
                                                                                     threads: tuple) -> None:
    """Issue 34: the 1-rank run used 2 torch threads, the 2-rank runs 1 each, so the efficiency compared unequal
    ranks. The finding states the threads per rank (run.json `torch_threads`); unequal ones make it invalid."""
    for ws, t in zip((1, 2), threads):
        d = simple_run(tmp_path, f"mm-w{ws}", kind="pretok-memmap", tokens_per_s=1000.0 * ws * 0.9, eff_frac=1.0,
                       world_size=ws)
        info = json.loads((d / "run.json").read_text())
        (d / "run.json").write_text(json.dumps({**info, "torch_threads": t}))
    runs = load_runs(tmp_path)
    f = {x["id"]: x for x in measured_findings(runs, None)}["scaling.pretok-memmap"]
    known = {t for t in threads if t is not None}
    assert f["valid"] is (len(known) == 1)
    if len(known) > 1:
        assert "unequal torch threads per rank" in f["reason"] and "mm-w1" in f["reason"]
    elif None in threads:
        assert "per rank 1/?" in f["question"].replace("torch threads ", "")
    else:
        t = known.pop()
        assert f"{t} torch thread{'s' * (t != 1)} per rank" in f["question"]
        screen = {x.key: x.value for x in study_findings(runs, None, [])}["scaling"]
        assert f"{t} torch thread" in screen


def test_findings_mark_the_runs_the_probe_flagged(tmp_path: Path) -> None:
    """Runs the sweep's machine probe flagged (launcher.json attempt `probe`) stay in the numbers but are marked:
    each finding drawn from them names them, the machine line says NOT quiet, the first screen says noisy."""
    from pretok_lib.machine.probe import verdict
    from pretok_lib.study.measured import study_measures

    runs_dir = tmp_path / "runs"
    for kind, r in (("padded", 1000.0), ("padding-free", 1500.0)):
        d = simple_run(runs_dir, f"sweep-{kind}", kind=kind, tokens_per_s=r, eff_frac=1.0)
        probe = verdict({"run": d.name, "calibration_drift": 0.0, "steal": 0.0, "loadavg": 1.0,
                         "outside_cpu_cores": 1.5 if kind == "padded" else 0.1})
        (d / "launcher.json").write_text(json.dumps({"attempts": [{"status": "completed", "probe": probe}]}))
    params = {"sweep_prefix": "sweep"}
    rec = study_measures(tmp_path, params)
    assert rec["machine"]["quiet"] is False and rec["machine"]["probed_runs"] == 2
    assert [f["run"] for f in rec["machine"]["flagged"]] == ["sweep-padded"]
    fs = {f["id"]: f for f in rec["findings"]}
    assert fs["packing.padding-free"]["flagged"] == ["sweep-padded"]
    assert fs["packing.padding-free"]["value"] == pytest.approx(1.5)    # marked, not excluded
    assert fs["stall.padding-free"]["flagged"] == [] and fs["stall.padded"]["flagged"] == ["sweep-padded"]
    html = findings_cell(tmp_path, {"profile": "quick", "parameters": params, **rec})
    assert "NOT quiet" in html and "noisy machine: runs sweep-padded flagged by the probe" in html


def _timed_run(root: Path, run_id: str, kind: str, sec_per_record: float, n: int = 8) -> None:
    """A run whose loss falls 0.25 per record (val likewise, every record) at `sec_per_record` seconds apart."""
    from ..analysis.helpers import train_record, val_record, write_run

    train = [train_record(5 * (i + 1), sec_per_record * (i + 1), loss=4.0 - 0.25 * i) for i in range(n)]
    val = [val_record(5 * (i + 1), sec_per_record * (i + 1) + 0.01, 4.1 - 0.25 * i) for i in range(n)]
    write_run(root, run_id, kind=kind, train=train, val=val)


@settings(max_examples=15, deadline=None)
@given(st.floats(1.2, 4.0), st.lists(st.floats(0.97, 1.03), min_size=3, max_size=5))
def test_time_to_target_speedup_is_a_paired_finding_covering_the_truth(speedup: float, noise: list[float]) -> None:
    """Issue 34 item 1: the time-to-target comparison is a finding with its interval and n, paired by repeat; the
    baseline taking `speedup` times as long per record (noise within ±3%) gives that ratio within the interval."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        for k, f in enumerate(noise):
            _timed_run(root, f"pm-r{k}", "pretok-memmap", 1.0)
            _timed_run(root, f"pf-r{k}", "padding-free", speedup * f)
        fs = {f["id"]: f for f in measured_findings(load_runs(root), None)}
    t = fs["time_to_target.pretok-memmap"]
    assert t["n"] == len(noise) and t["valid"] and t["unit"] == "x"
    lo, hi = t["interval"]
    assert lo <= t["value"] <= hi and lo <= speedup * 1.03 and hi >= speedup * 0.96   # val 0.01 s after its step
    assert t["resolved"] and sorted(t["runs"]) == sorted([f"pm-r{k}" for k in range(len(noise))]
                                                         + [f"pf-r{k}" for k in range(len(noise))])


def _loaders_json(pre: list[float], otf: list[float]) -> dict:
    return {"loaders": {"pretok-memmap w0": {"tokens_per_s": max(pre), "tokens_per_s_all": pre},
                        "padding-free w0": {"tokens_per_s": max(otf), "tokens_per_s_all": otf}}}


@pytest.mark.parametrize("ratio", [150.0, 1.4, 0.8])
def test_loader_ratios_are_findings_and_a_slower_pretokenized_loader_is_invalid(ratio: float) -> None:
    otf = [1000.0, 1100.0, 950.0]
    fs = {f["id"]: f for f in measured_findings([], None, (), _loaders_json([x * ratio for x in otf], otf))}
    f = fs["loaders.pretok-memmap"]
    assert f["value"] == pytest.approx(ratio) and f["n"] == 3
    assert f["valid"] is (ratio >= 1)
    if ratio < 1:
        assert f["reason"].startswith("pretokenized path slower in isolation") and not f["resolved"]


def test_a_ceiling_on_more_cores_below_fewer_is_an_invalid_finding() -> None:
    """The issue's 2-core ceiling (68.5 MB/s) below the 1-core one (78.9): the benchmark names it invalid, the
    study's finding carries it as invalid, never as a scaling number."""
    from pretok_lib.bench.tokenize_report import repeat_summary

    rounds = [{"(c) ceiling 1 core": 20 / 78.9, "(c) ceiling 2 cores": 20 / 68.5} for _ in range(3)]
    rep = repeat_summary({}, rounds, {"prefix_bytes": 2e6, "text_bytes": 20e6}, 2)
    assert any(w.startswith("ceiling on 2 cores") for w in rep["invalid"])
    fs = {f["id"]: f for f in measured_findings([], {"repeats": rep}, ())}
    f = fs["tokenization.ceiling"]
    assert f["valid"] is False and not f["resolved"] and "below the one on 1" in f["reason"]
    good = repeat_summary({}, [{"(c) ceiling 1 core": 0.25, "(c) ceiling 2 cores": 0.14}] * 3,
                          {"prefix_bytes": 2e6, "text_bytes": 20e6}, 2)
    g = {f["id"]: f for f in measured_findings([], {"repeats": good}, ())}["tokenization.ceiling"]
    assert g["valid"] and g["value"] == pytest.approx(0.25 / 0.14)


def test_every_number_on_a_measured_row_carries_its_interval_and_n(tmp_path: Path) -> None:
    """Issue 34: the first screen's rows showed summary spans ("x0.909–0.96 in training") without interval or n
    beside the measured lines; a row with measured findings now shows only those, each with [interval] and n,
    plus its context (a prediction or a count, never a timing)."""
    import re

    from ..analysis.helpers import study

    runs = load_runs(study(tmp_path))
    measured = measured_findings(runs, None)
    fs = study_findings(runs, None, [])
    html = findings_html(fs, measured=measured)
    for f in fs:
        row = html.split(f'data-key="{f.key}"')[1].split("</tr>")[0]
        value = row.split('class="finding-value">')[1].split("</td>")[0]
        spans = re.findall(r'<span class="measured"[^>]*>(.*?)</span>', value)
        if spans:
            assert all(re.search(r"\[.+, .+\] \(n=\d+\)", s) or s.endswith(": not measured") for s in spans)
            rest = re.sub(r'<span class="measured".*?</span>', "", value).replace("<br>", "")
            assert rest.split("<small")[0].strip() in ("", __import__("html").escape(f.context)), rest


def test_the_padded_paths_own_layout_validation_keeps_them_in_the_path_comparison(tmp_path: Path) -> None:
    """The study validates the padded paths on their own layout too (eval.own_path, linked to the data path): the
    padded runs' configs then differ from the packed runs' in eval.own_*, which split them into separate groups
    and the demo's packing gain was 'not measured'. eval.own_* is part of how a path runs, like data.*."""
    from ..analysis.helpers import train_record, val_record, write_run

    own = {"eval": {"every": 10, "own_path": "/d/pretok-padded", "own_kind": "pretok-padded"}}
    for k in range(3):
        for kind, rate, eff, extra in (("padded", 1000.0, 0.5, own), ("padding-free", 1000.0 + 10 * k, 1.0, None)):
            train = [train_record(5 * (i + 1), float(i + 1), tokens_per_s=rate, eff_frac=eff) for i in range(6)]
            write_run(tmp_path, f"{kind}-r{k}", kind=kind, train=train, val=[val_record(30, 6.5, 2.0)],
                      config_extra=extra)
    fs = {f["id"]: f for f in measured_findings(load_runs(tmp_path), None)}
    pack = fs["packing.padding-free"]
    assert pack["n"] == 3 and pack["value"] == pytest.approx(2.01, rel=0.01) and pack["resolved"]
