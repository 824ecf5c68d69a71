"""TokenizeConfig declares every tokenize default once: the command line's defaults are read from it."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from pretok_lib.cli import build_parser, tokenize_config
from pretok_lib.engine import config as tc

from ..conftest import ROOT

REQUIRED = ["tokenize", "in.jsonl", "--out", "o", "--tokenizer", "t"]


def test_command_line_defaults_are_the_dataclass_defaults(monkeypatch):
    for k in ("SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_MIN"):
        monkeypatch.delenv(k, raising=False)
    from_cli = dataclasses.asdict(tokenize_config(build_parser().parse_args(REQUIRED)))
    plain = dataclasses.asdict(tc.TokenizeConfig(inputs=["in.jsonl"], out="o", tokenizer="t"))
    assert from_cli.pop("command") and plain.pop("command")  # argv: whatever ran the tests
    assert from_cli == plain


@pytest.mark.parametrize("name,default", [("seq_len", 77), ("batch_mb", 0.5), ("format", "padded"), ("eos", "yes"),
                                          ("num_shards", 3), ("max_bad_fraction", 0.25), ("part_mb", 2.0)])
def test_a_changed_dataclass_default_reaches_the_command_line(monkeypatch, name, default):
    """A default changed in TokenizeConfig alone is what `pretok tokenize` uses (nothing restates it)."""
    for k in ("SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_MIN"):
        monkeypatch.delenv(k, raising=False)
    fields = {f.name: f for f in dataclasses.fields(tc.TokenizeConfig)}
    monkeypatch.setattr(fields[name], "default", default)
    assert getattr(tokenize_config(build_parser().parse_args(REQUIRED)), name) == default


def test_the_config_module_is_light():
    """Read by the parser of every command: it must not pull in the engine (pyarrow, numpy, the tokenizers)."""
    code = ("import sys; import pretok_lib.engine.config as t; t.default('workers'); "
            "print(sorted(m for m in ('pyarrow', 'numpy', 'pretok_lib.pretokenize', 'pretok_lib.engine.run', "
            "'pretok_lib.sources') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True, timeout=300)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("fmt", ["memmap", "token-list", "padded"])
@pytest.mark.parametrize("mb", [0.5, 10, 300, 1000, 2000, 2400, 5000, 8200, 64_000, 100_000])
def test_units_keep_many_workers_busy_for_memmap_and_few_files_for_parquet(fmt, mb):
    """Issue 37: inputs under ~2 GB were cut into at most 32 units, so at most 32 workers were ever busy. memmap (one
    output file) now gets ~1/1024 of the input a part, at least 8 MB (a unit's fixed cost: >= 288 units from 2.3 GB
    on, a 288-core node's workers each get one), the parquet formats keep ~1/32 (each part is a file), at least 1 MB;
    never over 64 MB, never the workers'."""
    from pretok_lib.engine.config import MIN_PART_BYTES, PARTS_MEMMAP, PARTS_PARQUET, TokenizeConfig

    text = int(mb * 1e6)
    cfg = TokenizeConfig(inputs=["x"], out="o", tokenizer="t", format=fmt)
    part = cfg.part_bytes(text)
    floor = 8e6 if fmt == "memmap" else 1e6
    assert MIN_PART_BYTES.get(fmt, 1e6) == floor and floor <= part <= 64e6
    share = PARTS_MEMMAP if fmt == "memmap" else PARTS_PARQUET
    assert part == int(min(64e6, max(floor, text / share)))
    if fmt == "memmap" and mb >= 2400:
        assert text / part >= 288
    if fmt == "memmap" and 8200 <= mb <= 64_000:
        assert text / part >= 1000
    assert TokenizeConfig(inputs=["x"], out="o", tokenizer="t", format=fmt, workers=7).part_bytes(text) == part
    assert TokenizeConfig(inputs=["x"], out="o", tokenizer="t", format=fmt, part_mb=3).part_bytes(text) == 3_000_000


@pytest.mark.parametrize("fmt", ["memmap", "token-list"])
@pytest.mark.parametrize("recorded", [None, 1, 999_999, 1_000_000, 2_000_000, 8_000_000, 64_000_000, 64_000_001])
@pytest.mark.parametrize("given", [None, "part_mb", "overwrite"])
def test_an_existing_outputs_part_size_is_kept_when_a_default_could_have_chosen_it(fmt, recorded, given):
    """With no --part-mb and no --overwrite, the part size an existing output was planned with is kept if it lies
    in [1 MB, 64 MB] (what a default plan of any version chose), else today's default; a --part-mb given is
    itself; --overwrite plans afresh."""
    from pretok_lib.engine.config import TokenizeConfig

    kw = {"part_mb": 3} if given == "part_mb" else {"overwrite": True} if given == "overwrite" else {}
    cfg = TokenizeConfig(inputs=["x"], out="o", tokenizer="t", format=fmt, **kw)
    text = 5_000_000_000
    got = cfg.planned_part_bytes(text, recorded)
    adopt = given is None and recorded is not None and 1_000_000 <= recorded <= 64_000_000
    assert got == (recorded if adopt else cfg.part_bytes(text))
    assert cfg.source_options(text, recorded).part_bytes == got
