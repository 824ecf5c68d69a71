"""The benchmarks' shared config bridge (`pretok_lib.bench.common`): the CLI and `run(cfg)` see the same settings."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pretok_lib.bench.common import check_targets, from_args, write_json
from pretok_lib.bench.loaders import LoadersBench
from pretok_lib.bench.tokenize import TokenizeBench
from pretok_lib.bench.train import TrainBench
from pretok_lib.cli import build_parser
from pretok_lib.errors import PretokError

BENCHES = {"tokenize": TokenizeBench, "loaders": LoadersBench, "train": TrainBench}


@pytest.mark.parametrize("name", BENCHES)
def test_cli_defaults_are_the_config_defaults(name):
    cls, args = BENCHES[name], build_parser().parse_args(["bench", name])
    assert all(hasattr(args, f.name) for f in dataclasses.fields(cls))  # every field is an option
    assert from_args(cls, args) == cls()


def test_cli_options_reach_the_config():
    argv = ["bench", "tokenize", "--workers", "3", "--skip", "loop", "rss-scan", "--formats", "memmap",
            "--loop-mb", "1.5", "--json", "out.json", "--check"]
    cfg = from_args(TokenizeBench, build_parser().parse_args(argv))
    assert (cfg.workers, cfg.skip, cfg.formats, cfg.loop_mb, cfg.json, cfg.check) == \
        (3, ["loop", "rss-scan"], ["memmap"], 1.5, "out.json", True)
    cfg = from_args(TrainBench, build_parser().parse_args(["bench", "train", "--set", "a=1", "b=2", "--steps", "4"]))
    assert (cfg.set, cfg.steps, cfg.mb) == (["a=1", "b=2"], 4, 5.0)
    assert cfg.record()["set"] == ["a=1", "b=2"] and "fn" not in cfg.record()


def test_results_json_and_the_targets_check(tmp_path):
    write_json(tmp_path / "a" / "r.json", {"x": tmp_path})  # parents made, non-JSON values as strings
    assert json.loads((tmp_path / "a" / "r.json").read_text()) == {"x": str(tmp_path)}
    write_json(None, {"x": 1})  # no path: nothing written
    check_targets(LoadersBench(check=False), failed=True)
    check_targets(LoadersBench(check=True), failed=False)
    with pytest.raises(PretokError, match="targets failed"):
        check_targets(LoadersBench(check=True), failed=True)


def _numeric_options(name: str) -> list[str]:
    """The options of `pretok bench <name>` that take a value of a type (numbers, lists of numbers)."""
    bench = next(a for a in build_parser()._actions if a.dest == "cmd").choices["bench"]
    sub = next(a for a in bench._actions if a.dest == "bench").choices[name]
    return [act.option_strings[-1] for act in sub._actions if act.option_strings and act.type is not None]


ODD = ["nan", "inf", "-inf", "-1", "0", "1e400", "a", "", "1,a", " ", "0.5", "3", "2,4"]


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(sorted(BENCHES)), st.data())
def test_odd_numbers_are_an_argument_error_never_a_traceback(name: str, data) -> None:
    """Every numeric option of every benchmark: a value it cannot take (nan, inf, 0 batches, 'a' workers) is
    argparse's one-line error (exit 2) before anything runs; `--loop-mb nan`, `--workers a`, `--batches 0` were
    tracebacks after minutes of corpus building. A value it takes is finite and within its range."""
    import math

    option = data.draw(st.sampled_from(_numeric_options(name)))
    text = data.draw(st.sampled_from(ODD) | st.text(alphabet="0123456789.,-e", max_size=6))
    try:
        args = build_parser().parse_args(["bench", name, option, text])
    except SystemExit as e:
        assert e.code == 2
        return
    value = getattr(args, option.lstrip("-").replace("-", "_"))
    for v in str(value).split(",") if isinstance(value, str) else [value]:
        if str(v).strip():
            assert math.isfinite(float(v)) and float(v) >= 0, (option, text, value)


@pytest.mark.parametrize("cut", [0, 1, 100, 5000])
def test_results_json_on_a_full_disk_keeps_the_previous_file(tmp_path, monkeypatch, cut: int) -> None:
    """`--json OUT` when the disk fills after `cut` bytes: one error naming OUT, the previous results intact and no
    temp file; a torn JSON was left in place, which notebook 05 read as "no benchmark results"."""
    import builtins
    import errno
    import io

    out = tmp_path / "r.json"
    write_json(out, {"previous": True})
    real_open = builtins.open

    class Full(io.StringIO):
        def __init__(self, fh):
            super().__init__()
            self.fh = fh

        def write(self, s):
            room = cut - self.fh.tell()
            self.fh.write(s[:max(0, room)])
            if len(s) > room:
                raise OSError(errno.ENOSPC, "No space left on device")
            return len(s)

        def close(self):
            self.fh.close()

        def __exit__(self, *exc):
            self.fh.close()

    def full_open(file, mode="r", *a, **kw):
        fh = real_open(file, mode, *a, **kw)
        return Full(fh) if "w" in mode and str(file).startswith(str(tmp_path)) else fh

    monkeypatch.setattr(builtins, "open", full_open)
    monkeypatch.setattr(io, "open", full_open)
    with pytest.raises(OSError) as e:
        write_json(out, {"x": "y" * 10_000})
    monkeypatch.undo()
    assert str(out) in str(e.value) and "No space left" in str(e.value)
    assert json.loads(out.read_text()) == {"previous": True} and [p.name for p in tmp_path.iterdir()] == ["r.json"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.01, 100.0), min_size=1, max_size=9), st.floats(0.01, 100.0))
def test_a_target_is_resolved_only_by_an_interval_wholly_on_one_side(samples: list[float], need: float) -> None:
    """Every benchmark (tokenize, loaders, train) decides its targets with `threshold_resolved`: one round has no
    interval, so its pass or fail is never resolved (the loaders benchmark said "resolved" at n=1)."""
    from pretok_lib.analysis.uncertainty import estimate
    from pretok_lib.bench.repeats import est_dict, threshold_resolved

    d = est_dict(estimate(samples))
    lo, hi = d["interval"]
    assert threshold_resolved(d, need) == (len(samples) >= 2 and not lo <= need <= hi)
    assert not threshold_resolved(None, need)
    if len(samples) == 1:
        assert not threshold_resolved(d, need)


def test_the_bench_says_when_the_embedded_corpus_repeats_its_sources(tmp_path):
    """Asked for more text than the sources hold, the embedded corpus repeats them (`demo/corpus.py`); encoders
    cache repeated words, so the bench's corpus line says how often, and at least how much text is distinct."""
    from pretok_lib.bench.common import corpus_repeats_note
    from pretok_lib.demo.corpus import build_corpus

    many = build_corpus(tmp_path / "many.parquet", max_mb=2, packages=["pluggy"], include_stdlib=False, extend=False)
    note = corpus_repeats_note(many.path)
    assert many.repeats > 1 and f"{many.repeats} passes" in note
    assert f"at least {many.text_bytes / many.repeats / 1e6:.3g} MB of distinct text" in note
    once = build_corpus(tmp_path / "once.parquet", max_mb=0.05, packages=["pluggy"], include_stdlib=False,
                        extend=False)
    assert once.repeats == 1 and corpus_repeats_note(once.path) == ""
    other = tmp_path / "user.parquet"  # a corpus of the user's: nothing is known about repeats
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["a b c"]}), other)
    assert corpus_repeats_note(other) == ""
