"""The methods `pretok bench tokenize` times: (a) a per-document loop, (b) datasets.map, (c) the backend's
in-memory ceiling, each in a spawned child (own memory, own CPU pinning), and (d) the engine, in-process.

Every method sees the same documents (the engine's readers, bad documents dropped).
"""

from __future__ import annotations

import functools
import os
import shutil
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from ..errors import PretokError
from ..machine.memory import peak_rss_mb


def iter_docs(path: str) -> Iterator[str]:
    """Documents of `path` in engine order, through the engine's readers and default bad-document policy."""
    from ..sources import SourceOptions, expand_inputs, plan_units, read_unit

    opts = SourceOptions()  # the engine's defaults; document order does not depend on the part size
    for unit in plan_units(expand_inputs([path]), opts):
        for batch in read_unit(unit, opts):
            yield from batch.texts


def scan_corpus(path: str, prefix_bytes: int, prefix_out: Path) -> dict:
    """Count documents and UTF-8 bytes; write the first documents up to `prefix_bytes` (>= 1 doc) as parquet."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    docs = nbytes = k = kbytes = 0
    prefix: list[str] = []
    for t in iter_docs(path):
        n = len(t.encode("utf-8"))
        if k == docs and (kbytes + n <= prefix_bytes or k == 0):
            prefix.append(t)
            k, kbytes = k + 1, kbytes + n
        docs, nbytes = docs + 1, nbytes + n
    if not docs:
        raise PretokError("no documents in the benchmark corpus", path)
    pq.write_table(pa.table({"text": prefix}), prefix_out)
    return {"path": path, "documents": docs, "text_bytes": nbytes, "prefix_documents": k, "prefix_bytes": kbytes,
            "prefix_path": str(prefix_out)}


def in_child(fn: Callable[..., dict], *args: Any) -> dict:
    """Run `fn(*args)` in a fresh spawned process (own memory, own CPU pinning) and return its result."""
    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as ex:
        return ex.submit(fn, *args).result()


def _engine_cpu(run: dict) -> dict:
    """The manifest's CPU accounts (`engine/run.py`): the main process's in all and from the first batch on, the
    workers'."""
    return {k: run.get(k) for k in ("main_cpu_seconds", "main_cpu_streaming_seconds", "workers_cpu_seconds")}


class ChildRss:
    """Peak RSS of any single descendant process, sampled every `interval` seconds by a thread (`datasets.map`'s
    workers; the engine's workers record their own)."""

    def __init__(self, interval: float = 0.02):
        self.interval, self.peak_mb, self._stop = interval, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import psutil

        me = psutil.Process()
        while not self._stop.wait(self.interval):
            for p in me.children(recursive=True):
                try:
                    self.peak_mb = max(self.peak_mb, round(p.memory_info().rss / 2**20, 1))
                except psutil.Error:
                    pass

    def __enter__(self) -> ChildRss:
        return self._thread.start() or self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def same_as_engine(ids: np.ndarray, offsets: np.ndarray, ref: dict | None) -> bool | None:
    """Whether the engine's memmap output `ref` starts with exactly these documents (after its BOS/EOS policy)."""
    if ref is None:
        return None
    from ..engine.parts import add_special
    from ..formats.memmap import MemmapDataset

    ds = MemmapDataset(Path(ref["out"]) / "data")
    want, want_off = add_special(np.asarray(ids, np.uint32), np.asarray(offsets, np.int64), ref["bos"], ref["eos"])
    k = len(want_off) - 1
    if len(ds) < k or not np.array_equal(np.asarray(ds.lengths[:k]), np.diff(want_off)):
        return False
    return bool(np.array_equal(ds.tokens[: len(want)], want))


def hf_tokenizer(tok_file: str) -> Any:
    """HF fast tokenizer from tokenizer.json; special-token strings in text stay plain text, as in the engine."""
    from transformers import PreTrainedTokenizerFast

    path = Path(tok_file) / "tokenizer.json" if Path(tok_file).is_dir() else Path(tok_file)
    if path.suffix != ".json":
        raise PretokError("baselines (a)/(b) need a HF tokenizer.json (or --skip loop datasets-map)", tok_file)
    return PreTrainedTokenizerFast(tokenizer_file=str(path), split_special_tokens=True, model_max_length=10**12)


# ---------------------------------------------------------------- (a), (b), (c): each in a spawned child


def child_loop(prefix: str, tok_file: str, ref: dict | None) -> dict:
    """(a) `tok(text)["input_ids"]` per document on one pinned core, kept as a uint32 array per document (what a
    Dataset.__getitem__ tokenizing on the fly returns)."""
    from ..tokenizer import limit_threads_to_one_cpu

    limit_threads_to_one_cpu(0)
    tok = hf_tokenizer(tok_file)
    texts = list(iter_docs(prefix))
    t0 = time.perf_counter()
    out = [np.array(tok(t, add_special_tokens=False)["input_ids"], np.uint32) for t in texts]
    secs, rss = time.perf_counter() - t0, round(peak_rss_mb(), 1)
    off = np.concatenate([[0], np.cumsum([len(x) for x in out], dtype=np.int64)])
    ids = np.concatenate(out) if out else np.empty(0, np.uint32)
    return {"seconds": secs, "documents": len(texts), "tokens": int(off[-1]), "peak_rss_mb": rss,
            "ids_identical": same_as_engine(ids, off, ref)}


def _hf_encode(tok: Any, batch: dict) -> dict:
    """The `datasets.map` function: run_clm.py's `tokenize_function` (input_ids + attention_mask)."""
    return tok(batch["text"], add_special_tokens=False)


def child_datasets(prefix: str, tok_file: str, workers: int, workdir: str, ref: dict | None) -> dict:
    """(b) `Dataset.from_parquet` (untimed) + `.map(batched=True, num_proc=N)` + `save_to_disk`, fresh caches."""
    import datasets

    datasets.disable_progress_bars()
    cache, saved = Path(workdir) / "hf-cache", Path(workdir) / "hf-saved"
    for d in (cache, saved):
        shutil.rmtree(d, ignore_errors=True)
    fn = functools.partial(_hf_encode, hf_tokenizer(tok_file))
    t0 = time.perf_counter()
    ds = datasets.Dataset.from_parquet(prefix, cache_dir=str(cache))
    t1 = time.perf_counter()
    with ChildRss() as workers_rss:
        out = ds.map(fn, batched=True, num_proc=workers, remove_columns=ds.column_names, load_from_cache_file=False)
        out.save_to_disk(str(saved))
    secs, main_rss = time.perf_counter() - t1, round(peak_rss_mb(), 1)
    col = datasets.load_from_disk(str(saved)).data.column("input_ids").combine_chunks()
    off = col.offsets.to_numpy().astype(np.int64)
    ids, off = col.flatten().to_numpy(), off - off[0]
    disk = sum(f.stat().st_size for f in saved.rglob("*") if f.is_file())
    return {"seconds": secs, "load_seconds": t1 - t0, "documents": len(off) - 1, "tokens": int(off[-1]),
            "stored_tokens": int(off[-1]), "disk_bytes": disk, "peak_rss_mb": max(main_rss, workers_rss.peak_mb),
            "main_peak_rss_mb": main_rss, "workers_peak_rss_mb": workers_rss.peak_mb, "columns": out.column_names,
            "ids_identical": same_as_engine(ids, off, ref)}


def _ceiling_batches(corpus: str, batch_bytes: int) -> list[list[str]]:
    batches: list[list[str]] = [[]]
    size = 0
    for t in iter_docs(corpus):
        if size >= batch_bytes:
            batches.append([])
            size = 0
        batches[-1].append(t)
        size += len(t.encode("utf-8"))
    return batches


_BARRIER: list = []


def _keep_barrier(barrier: Any) -> None:
    _BARRIER.append(barrier)  # a multiprocessing Barrier is shared by inheritance only (initializer arguments)


def child_ceiling(corpus: str, tok_spec: str, backend: str, batch_bytes: int, ref: dict | None, slot: int = 0,
                  n: int = 1) -> dict:
    """(c) One timed pass of `encode_batch` over ~batch_bytes batches of texts already in memory: one pinned core,
    no I/O, a fresh encoder (as each engine run has: no caches warm from an earlier pass). With n > 1 this is one
    of n such processes, each pinned to its own core, encoding every n-th batch from the moment all are ready."""
    from ..tokenizer import limit_threads_to_one_cpu, load_tokenizer, make_encoder

    limit_threads_to_one_cpu(slot)
    info = load_tokenizer(tok_spec)
    batches = _ceiling_batches(corpus, batch_bytes)
    mine = batches[slot::n]
    enc = make_encoder(info, backend)
    enc.encode_batch(batches[0][:8])  # warm-up (lazy initialisation), untimed
    if _BARRIER:
        _BARRIER[0].wait()
    tokens = 0
    t0 = time.perf_counter()
    for b in mine:  # results are dropped as the engine's are: keeping them would time page faults, not encoding
        tokens += int(enc.encode_batch(b)[1][-1])
    out = {"seconds": time.perf_counter() - t0, "peak_rss_mb": round(peak_rss_mb(), 1), "tokens": tokens,
           "documents": sum(len(b) for b in mine), "backend": backend}
    if n == 1 and ref is not None:  # untimed second pass: the same ids as the engine stored?
        results = [enc.encode_batch(b) for b in mine]
        ids = np.concatenate([np.asarray(r[0], np.uint32) for r in results])
        off = np.concatenate([[0], np.cumsum(np.concatenate([np.diff(r[1]) for r in results]))])
        out["ids_identical"] = same_as_engine(ids, off, ref)
    return out


def ceiling_parallel(corpus: str, tok_spec: str, backend: str, batch_bytes: int, n: int) -> dict:
    """(c) on n cores, measured: n pinned processes encode disjoint batches, starting together; the slowest one's
    time."""
    ctx = get_context("spawn")
    with ProcessPoolExecutor(n, mp_context=ctx, initializer=_keep_barrier, initargs=(ctx.Barrier(n),)) as ex:
        futures = [ex.submit(child_ceiling, corpus, tok_spec, backend, batch_bytes, None, k, n) for k in range(n)]
        parts = [f.result() for f in futures]
    return {"seconds": max(p["seconds"] for p in parts), "documents": sum(p["documents"] for p in parts),
            "tokens": sum(p["tokens"] for p in parts), "peak_rss_mb": max(p["peak_rss_mb"] for p in parts),
            "backend": backend, "ids_identical": None}


# ---------------------------------------------------------------- (d) the engine


def run_engine(corpus: str, tok: str, fmt: str, workers: int, out: Path, part_mb: float | None,
               batch_mb: float | None) -> dict:
    """One `run_tokenize` (in-process; workers are spawned): wall time, counts, worker RSS, on-disk size."""
    from ..pretokenize import TokenizeConfig, run_tokenize

    cfg = TokenizeConfig(inputs=[corpus], out=str(out), tokenizer=tok, format=fmt, workers=workers,
                         progress=False)
    cfg.part_mb, cfg.batch_mb = part_mb or cfg.part_mb, batch_mb or cfg.batch_mb
    shutil.rmtree(out, ignore_errors=True)  # deleting an old output is not part of the measurement
    os.sync()  # start each timing without dirty pages of earlier runs being written back meanwhile
    # no sampler thread beside it: it would take CPU from the workers and count in the main process's CPU
    t0 = time.perf_counter()
    m = run_tokenize(cfg)
    secs = time.perf_counter() - t0
    c, pol = m["counts"], m["policy"]
    specials = (pol["bos_id"] is not None) + (pol["eos_id"] is not None)
    return {"seconds": secs, "manifest_wall_seconds": m["run"]["wall_seconds"], "documents": c["documents"],
            "input_bytes": c["input_bytes"],
            "timeline": {k: m["run"].get(k) for k in ("startup_seconds", "tokenize_seconds", "finish_seconds")},
            "cpu": _engine_cpu(m["run"]),
            # padded: counts.tokens are the kept tokens; the truncated ones are counted apart
            "tokens": c["tokens"] + c.get("truncated", 0) - specials * c["documents"], "engine_tokens": c["tokens"],
            "stored_tokens": c["tokens"], "disk_bytes": sum(f["size"] for f in m["files"]),
            "peak_rss_mb": m["run"]["worker_peak_rss_mb"],  # each worker's own VmHWM, from the manifest
            "units": len(m["parts"]), "workers": workers, "backend": m["tokenizer"]["backend"]["backend"],
            "out": str(out), "policy": pol}
