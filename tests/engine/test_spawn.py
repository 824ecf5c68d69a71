"""The zygote started early by `pretok tokenize` (`engine/spawn.py`): taken over by a run with the same arguments,
killed otherwise, and never left behind by a command that ends without taking it over."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pretok_lib.engine import spawn
from pretok_lib.engine.workers import Workers
from pretok_lib.tokenizer import load_tokenizer
from tests.conftest import GPT2_JSON

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def nothing_left():
    yield
    spawn.discard_early()


def test_a_run_with_the_same_arguments_takes_the_early_zygote_over():
    spawn.start_early(str(GPT2_JSON), None, 2, ())
    early = spawn._EARLY[0]
    with Workers(str(GPT2_JSON), None, 2, ()) as w:
        assert w.zygote is early.zygote and not spawn._EARLY
        w.expect(1)
        assert w.backend(load_tokenizer(str(GPT2_JSON)), None) == "fastokens"  # it builds as any zygote would
        end = time.monotonic() + 60  # only catches a hang
        while w.started is None and time.monotonic() < end:
            time.sleep(0.01)
        assert w.started == 1  # and forks the plan's workers
    assert early.zygote.exitcode is not None  # closed with the run (killed: nothing was run)


@pytest.mark.parametrize("other", [(str(GPT2_JSON), "hf-tokenizers", 2, ()), (str(GPT2_JSON), None, 3, ()),
                                   (str(GPT2_JSON), None, 2, ("s3",)), ("gpt2-other.json", None, 2, ())])
def test_a_zygote_started_for_other_arguments_is_killed_not_taken(other):
    spawn.start_early(str(GPT2_JSON), None, 2, ())
    early = spawn._EARLY[0]
    assert spawn.take_early(*other) is None
    early.zygote.join(10)
    assert early.zygote.exitcode is not None and not spawn._EARLY


def test_discard_kills_an_early_zygote_mid_start_up():
    spawn.start_early(str(GPT2_JSON), None, 4, ())
    early = spawn._EARLY[0]
    spawn.discard_early()
    assert early.zygote.exitcode is not None and not spawn._EARLY
    spawn.discard_early()  # nothing left: a no-op


def _corpus(tmp_path: Path) -> Path:
    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"text": [f"document {i} " * 50 for i in range(300)]}), path)
    return path


def _tokenize(*args: str) -> tuple[subprocess.CompletedProcess, float]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "pretok_lib.cli", "tokenize", *args, "--tokenizer", str(GPT2_JSON),
                        "--workers", "2", "--no-progress"], capture_output=True, text=True, timeout=120, env=env,
                       cwd=ROOT)
    return r, time.monotonic() - t0


def test_commands_that_end_before_the_run_takes_the_zygote_over_leave_none_behind(tmp_path):
    """A refused output (another config), an input that is not there, an output that overlaps its input: each
    fails with its one line and exits. An early zygote not killed would keep the command from exiting (Python
    joins its child processes at exit) and run workers for nothing; the same command then completes."""
    corpus = _corpus(tmp_path)
    r, _ = _tokenize(str(corpus), "--out", str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr
    cases = [[str(corpus), "--out", str(tmp_path / "o"), "--eos", "yes"],      # another config: refused
             [str(tmp_path / "missing.parquet"), "--out", str(tmp_path / "m")],  # no such input
             [str(corpus), "--out", str(tmp_path)]]                            # the output holds the input
    for args in cases:
        r, _ = _tokenize(*args)
        lines = r.stderr.strip().splitlines()
        assert r.returncode != 0 and len(lines) == 1, (args, r.stderr)
    m = json.loads((tmp_path / "o" / "manifest.json").read_text())
    r, _ = _tokenize(str(corpus), "--out", str(tmp_path / "o"))  # complete: no zygote is started for it
    assert r.returncode == 0 and json.loads((tmp_path / "o" / "manifest.json").read_text()) == m
