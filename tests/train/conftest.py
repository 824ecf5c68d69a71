"""Fixtures for the training tests: a short-document corpus (Wikipedia summaries) pretokenized with GPT-2 into
every format, a held-out split, and a tiny model config (runs in a second on one CPU core)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pretok_lib.pretokenize import TokenizeConfig, run_tokenize
from pretok_lib.train.metrics import read_records

from ..conftest import GPT2_JSON, ROOT, WIKI_EN, tiny_memmap

SEQ = 64


@dataclass
class TrainData:
    text: Path                 # parquet of training documents (the baselines' input)
    dirs: dict[str, Path]      # data kind → pretokenized dir
    val: Path                  # memmap of held-out documents

    def path_for(self, kind: str) -> Path:
        return self.text if kind in ("padded", "padding-free") else self.dirs[kind]


@pytest.fixture(scope="session")
def train_data(tmp_path_factory, shared_data) -> TrainData:
    base = tmp_path_factory.mktemp("train-data")
    docs = [v["extract"] for v in json.loads(WIKI_EN.read_text()).values()]
    text, val_text = base / "train.parquet", base / "val.parquet"
    pq.write_table(pa.table({"text": docs[:300]}), text)
    pq.write_table(pa.table({"text": docs[300:360]}), val_text)
    dirs = {}
    for fmt in ("padded", "token-list", "memmap"):
        run_tokenize(TokenizeConfig(inputs=[str(text)], out=str(base / fmt), tokenizer=str(GPT2_JSON), format=fmt,
                                    seq_len=SEQ, workers=0, progress=False))
        dirs[f"pretok-{fmt}"] = base / fmt
    run_tokenize(TokenizeConfig(inputs=[str(val_text)], out=str(base / "val"), tokenizer=str(GPT2_JSON),
                                format="memmap", workers=0, progress=False))
    return TrainData(text, dirs, base / "val")


def tiny_overrides(data: TrainData, runs: Path, kind: str = "pretok-memmap", **extra) -> list[str]:
    """CLI overrides of a tiny fp32 run on `kind` (no config file needed); no end-of-run export (test_export opts
    in: it costs a subprocess run ~0.8 CPU-s)."""
    o = {"run.dir": str(runs), "run.id": "run", "model.hidden_size": 64, "model.num_layers": 2,
         "model.num_heads": 4, "model.num_kv_heads": 2, "data.kind": kind, "data.path": str(data.path_for(kind)),
         "data.tokenizer": str(GPT2_JSON), "data.seq_len": SEQ, "data.micro_batch": 4, "train.steps": 3,
         "train.warmup_steps": 2, "train.precision": "fp32", "log.tensorboard": False, "checkpoint.every": 0,
         "checkpoint.export": False}
    o.update(extra)
    return [f"{k}={v}" for k, v in o.items()]


def run_cli(overrides: list[str], nproc: int = 1, check: bool = True, timeout: float = 300,
            **popen) -> subprocess.CompletedProcess:
    """`python -m pretok_lib.train` (or torchrun with `nproc` gloo ranks) in a subprocess, 1 thread per rank."""
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    if nproc == 1:
        cmd = [sys.executable, "-m", "pretok_lib.train", *overrides]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               "-m", "pretok_lib.train", *overrides]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, **popen)
    if check and p.returncode != 0:
        raise AssertionError(f"exit {p.returncode}\n{p.stderr[-3000:]}")
    return p


def run_here(overrides: list[str]) -> None:
    """The run of `overrides` in this process (no interpreter start), on one thread like run_cli's ranks."""
    import torch

    from pretok_lib.train.config import load_config
    from pretok_lib.train.run import train

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert train(load_config(None, overrides)) == 0
    finally:
        torch.set_num_threads(threads)


def records(run_dir: Path, kind: str = "train") -> list[dict]:
    """A run's complete `kind` records; safe on a live log (a half-written last line is left out)."""
    return read_records(run_dir / "metrics.jsonl", kind)


@pytest.fixture(scope="module")
def one_thread():
    """Runs in this process and in subprocesses (OMP_NUM_THREADS=1) compute alike, bit for bit."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def sized_corpus(base: Path, sentence: str, seq_len: int, micro_batch: int, fits, formats=("memmap",), docs: int = 4,
                 lengths=range(2, 80)) -> tuple[Path, Path, dict[str, Path], int]:
    """(source jsonl, tokenizer, {format: output}, samples) of `docs` documents of n words of `sentence`, for the
    first n in `lengths` whose memmap output holds `fits(samples)` windows of seq_len + 1 (epochs of a chosen size)."""
    from pretok_lib.data import make_dataset

    _, tok = tiny_memmap(base)
    words = sentence.split()
    for n in lengths:
        src = base / f"docs-{n}.jsonl"
        src.write_text("".join(json.dumps({"text": " ".join(words[(i + j) % len(words)] for j in range(n))}) + "\n"
                               for i in range(docs)))
        out = {fmt: base / f"{fmt}-{n}" for fmt in formats}
        for fmt, o in out.items():
            run_tokenize(TokenizeConfig(inputs=[str(src)], out=str(o), tokenizer=str(tok), format=fmt, workers=0,
                                        progress=False))
        samples = make_dataset("pretok-memmap", out["memmap"], seq_len, micro_batch=micro_batch).source.num_samples
        if fits(samples):
            return src, tok, out, samples
    raise AssertionError(f"no document length of {list(lengths)[0]}-{list(lengths)[-1]} words fits")
