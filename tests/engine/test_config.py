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
