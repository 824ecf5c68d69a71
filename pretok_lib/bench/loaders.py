"""`pretok bench loaders`: loader-only throughput of the five data paths vs a raw-memmap ceiling, in one run.

Every path reads the same corpus with the same tokenizer (pretokenized once into the workdir) and is timed as a
consumer of collated batches: tokens/s and batches/s, with 0 and N DataLoader workers. References run in the same
process: nanoGPT's `get_batch` on the memmap output's `data.bin` (random windows, the ceiling), a `torch.randint`
batch (no data at all) and, per worker count N > 0, that batch made in DataLoader workers (the cost of the process
boundary alone). A second table reads the padded / token-list parquet files written with each compression codec.
How each number is measured is printed under the tables (NOTES).
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch

from ..analysis.supply import VIA  # the reference's row name: analysis reads it back from the bench's JSON
from ..analysis.uncertainty import estimate
from ..datapaths import BASELINE, FORMAT_OF, KINDS, ON_THE_FLY, PACKED, PARQUET_KINDS
from ..datapaths import PRETOK_MEMMAP as MM
from ..errors import PretokError
from ..formats import CODEC_GRID, TRAIN_COMPRESSION
from ..machine.cpu_affinity import usable_cpus
from ..machine.probe import machine_line
from . import fmt_num
from .common import (BenchConfig, add_common_args, add_output_args, at_least, check_targets, corpus_and_tokenizer,
                     counts, environment, from_args, non_negative, offline, write_json)
from .repeats import est_dict, probes_of, ratio_estimate, rounds, text, threshold_resolved

SLOW = ON_THE_FLY  # tokenize on the fly: measured over --slow-batches
COMPRESSIONS = CODEC_GRID
CEIL, RAND = "ref: raw memmap get_batch", "ref: in-memory torch.randint"
COUNTS = ("tokens", "effective_tokens", "padding_tokens", "masked_tokens")
NOTES = """\
Timed: {n} batches ({slow} for the on-the-fly paths padded / padding-free) after {warm} untimed warm-up batches,
    which absorb DataLoader worker start-up, lazy loads and tokenizer init; "setup s" = dataset construction + first
    batch (what the warm-up hides). Rates are per batch, so different batch counts compare. shuffle=True, seed {seed}.
    Every row is measured {reps} times (fresh dataset and loader each time) and the fastest is shown (shared machine).
    An epoch end inside the timed batches restarts the DataLoader: the restart and its first batch are not timed.
tokens/s: input slots of the collated batches (B x seq_len, padding included); eff tok/s: labels that count
    (not -100). pad frac = padding_tokens / tokens (padded paths); masked frac = masked_tokens / tokens (labels
    crossing a document start, packed paths). x ceiling: tokens/s / {ceil}; x padded: / padded at the same workers.
{ceil}: nanoGPT train.py's get_batch in-process (np.memmap opened per batch,
    torch.randint offsets, x/y sliced, astype int64, stacked): random windows, no document masking.
{rand}: two torch.randint int64 tensors of the batch shape per batch (no data read at all);
    "via DataLoader wN": the same batches made in N DataLoader workers: the cost of moving a batch between processes.
Compression: every part file read with pq.read_table + to numpy (all columns), best of {rep}, warm page cache
    (caches cannot be dropped here). MB/s: decoded array bytes; tokens/s: stored tokens (padding excluded);
    bytes/token: file bytes / stored tokens. Loader: the pretok path on that variant, 0 workers, no
    tokenizer check: setup = open + load into memory + first batch."""


@dataclass
class LoadersBench(BenchConfig):
    """`pretok bench loaders`: the batch shape, the worker counts, how long each row is timed, the codecs; with
    `memory`, only the bounded-vs-in-RAM memory benchmark on those outputs (`loaders_memory.py`)."""

    workdir: str = "runs/bench/loaders"
    seq_len: int = 1024
    micro_batch: int = 8
    workers: str = "0,2"  # DataLoader worker counts, comma-separated
    batches: int = 500  # timed batches per measurement
    slow_batches: int = 20  # timed batches for the on-the-fly paths
    warmup: int = 5  # untimed batches before timing starts
    compressions: str = ",".join(COMPRESSIONS)  # parquet codecs to read ('' = skip)
    read_repeats: int = 3  # reads per compression variant (best is kept)
    repeats: int = 3  # rounds of every row, interleaved and rotated; the table keeps the fastest
    probe: bool = True  # machine_probe around every measurement
    seed: int = 0
    paths: str = ",".join(KINDS)  # the data paths measured, comma-separated
    pace_ms: float = 0.0  # > 0: each path also called once per P ms (loaders_paced.py), for the stall model
    paced_batches: int = 10
    memory: list[str] = field(default_factory=list)  # KIND=DIR outputs for the memory benchmark
    memory_world: int = 4  # ranks simulated (rank 0 is measured)
    memory_batches: int = 8000  # timed batches (in-ram, block)
    memory_exact_batches: int = 100  # timed batches (exact order)
    cache_mb: float | None = None  # decoded row-group cache per process
    block_groups: int | None = None  # row groups per block-order window


def add_args(p: argparse.ArgumentParser) -> None:
    """Arguments of `pretok bench loaders` (defaults: `LoadersBench`)."""
    d = LoadersBench()
    add_common_args(p, d, "corpus cache and pretokenized outputs")
    p.add_argument("--seq-len", type=at_least(1), default=d.seq_len)
    p.add_argument("--micro-batch", type=at_least(1), default=d.micro_batch)
    p.add_argument("--workers", type=counts(0), default=d.workers, help="DataLoader worker counts, comma-separated")
    p.add_argument("--batches", type=at_least(1), default=d.batches, help="timed batches per measurement")
    p.add_argument("--slow-batches", type=at_least(1), default=d.slow_batches, help="timed batches for padded / padding-free")
    p.add_argument("--warmup", type=at_least(0), default=d.warmup, help="untimed batches before timing starts")
    p.add_argument("--compressions", default=d.compressions, help="parquet codecs to read ('' = skip)")
    p.add_argument("--read-repeats", type=at_least(1), default=d.read_repeats,
                   help="reads per compression variant (best is kept)")
    p.add_argument("--repeats", type=at_least(1), default=d.repeats,
                   help="rounds of every row, interleaved with the order rotated; the table keeps the fastest, the "
                        "targets take the median of the rounds' ratios with its interval")
    p.add_argument("--no-probe", dest="probe", action="store_false", help="no machine probe around the measurements")
    p.add_argument("--seed", type=at_least(0), default=d.seed)
    p.add_argument("--paths", default=d.paths, help="the data paths measured, comma-separated (default: all five)")
    p.add_argument("--pace-ms", type=non_negative, default=d.pace_ms,
                   help="> 0: also time each path's next() called once per this many ms (a training step's pace)")
    p.add_argument("--paced-batches", type=at_least(1), default=d.paced_batches)
    add_output_args(p)
    from .loaders_memory import add_args as add_memory_args

    add_memory_args(p, d)


def variant_dir(fmt: str, compression: str) -> str:
    """Output directory name of one format x codec (memmap has no codec)."""
    return fmt if fmt == "memmap" else f"{fmt}-{compression.replace(':', '')}"


def pretokenize(corpus: str, tok: str, fmt: str, seq_len: int, compression: str, out: Path) -> dict:
    """`run_tokenize` into `out`; reuses a finished output of the same config, replaces one of another config."""
    from ..pretokenize import TokenizeConfig, run_tokenize

    cfg = TokenizeConfig(inputs=[corpus], out=str(out), tokenizer=tok, format=fmt, seq_len=seq_len,
                         compression=compression, progress=False, overwrite=False, command=["pretok", "bench"])
    try:
        return run_tokenize(cfg)
    except PretokError as e:
        if "different config" not in str(e):
            raise
        cfg.overwrite = True
        return run_tokenize(cfg)


def measure(make_iter: Callable[[], Iterator[dict]], n: int, warmup: int) -> dict:
    """Pull `warmup` + `n` batches and time the last `n`. At an epoch end the iterable is re-entered; the restart
    (new DataLoader workers) and the first batch after it are not timed."""
    t0 = time.perf_counter()
    it, epochs, skip, done, first, secs = make_iter(), 1, warmup, 0, None, 0.0
    start = t0 if warmup == 0 else None
    totals = dict.fromkeys(COUNTS, 0)
    try:
        while done < n:
            try:
                b = next(it)
            except StopIteration:
                if first is None:
                    raise PretokError("the data path yields no batches (corpus too small for the batch?)") from None
                if start is not None:
                    secs, start = secs + time.perf_counter() - start, None
                it, epochs, skip = make_iter(), epochs + 1, max(skip, 1)
                continue
            if first is None:
                first = time.perf_counter() - t0
            if skip:
                skip -= 1
                start = time.perf_counter() if skip == 0 else None
                continue
            for k in COUNTS:
                totals[k] += int(b.get(k, 0))
            done += 1
        secs += time.perf_counter() - start
    finally:
        getattr(it, "close", lambda: None)()  # shuts DataLoader workers down
    return {"batches": n, "seconds": secs, "first_batch_s": first, "epochs": epochs, **totals}


def rates(r: dict) -> dict:
    """Add tokens/s, effective tokens/s, batches/s and the padding / masked fractions."""
    s, t = r["seconds"], r["tokens"]
    r.update(tokens_per_s=t / s, effective_tokens_per_s=r["effective_tokens"] / s, batches_per_s=r["batches"] / s,
             padding_fraction=r["padding_tokens"] / t if t else None,
             masked_fraction=r["masked_tokens"] / t if t else None)
    return r


def bench_path(kind: str, src: str, tok: str | None, a: LoadersBench, workers: int, n: int) -> dict:
    """One data path at one worker count: construction (timed apart), then `measure`. A pretokenized path given
    `tok` checks the output's tokenizer fingerprint on construction (loads the tokenizer), as training would."""
    from ..data import make_dataset, make_loader

    t0 = time.perf_counter()
    ds = make_dataset(kind, src, a.seq_len, micro_batch=a.micro_batch, tokenizer=tok, seed=a.seed, shuffle=True)
    loader = make_loader(ds, num_workers=workers)
    build = time.perf_counter() - t0
    r = measure(lambda: iter(loader), n, a.warmup)
    return rates({"kind": kind, "workers": workers, "build_s": build, "setup_s": build + r["first_batch_s"], **r})


def nanogpt_batches(bin_path: Path, dtype: str, block: int, batch: int, seed: int) -> Iterator[dict]:
    """nanoGPT train.py `get_batch` (memmap re-opened per batch to avoid its leak), as count-carrying batches."""
    g = torch.Generator().manual_seed(seed)
    while True:
        data = np.memmap(bin_path, dtype=dtype, mode="r")
        ix = torch.randint(len(data) - block, (batch,), generator=g)
        x = torch.stack([torch.from_numpy((data[i : i + block]).astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy((data[i + 1 : i + 1 + block]).astype(np.int64)) for i in ix])
        yield {"input_ids": x, "labels": y, "tokens": x.numel(), "effective_tokens": y.numel()}


def random_batches(vocab: int, block: int, batch: int, seed: int) -> Iterator[dict]:
    """Two random int64 tensors of the batch shape: the cost of a batch with no data behind it."""
    g = torch.Generator().manual_seed(seed)
    while True:
        x = torch.randint(vocab, (batch, block), generator=g)
        y = torch.randint(vocab, (batch, block), generator=g)
        yield {"input_ids": x, "labels": y, "tokens": x.numel(), "effective_tokens": y.numel()}


class RandomBatches(torch.utils.data.IterableDataset):
    """`random_batches` as a dataset, to measure the DataLoader's own cost with workers."""

    def __init__(self, vocab: int, block: int, batch: int, seed: int) -> None:
        super().__init__()
        self.args = (vocab, block, batch, seed)

    def __iter__(self) -> Iterator[dict]:
        info = torch.utils.data.get_worker_info()
        vocab, block, batch, seed = self.args
        return random_batches(vocab, block, batch, seed + (info.id if info else 0))


def via_dataloader(ds: torch.utils.data.IterableDataset, workers: int) -> Iterator[dict]:
    """Iterate `ds` through a DataLoader set up like `make_loader` (batch_size=None, prefetch 2)."""
    return iter(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers,
                                            prefetch_factor=2 if workers else None))


def read_parquet_files(out: Path, m: dict) -> tuple[float, int]:
    """Seconds to read every part file into numpy arrays (all columns), and the decoded bytes."""
    import pyarrow.parquet as pq

    t0, nbytes = time.perf_counter(), 0
    for f in m["files"]:
        for col in pq.read_table(out / f["path"]).columns:
            nbytes += col.combine_chunks().flatten().to_numpy().nbytes
    return time.perf_counter() - t0, nbytes


def bench_compression(corpus: str, tok: str, a: LoadersBench, work: Path) -> list[dict]:
    """Write padded and token-list with each codec; time warm reads and the pretok loader's first load."""
    rows = []
    for kind, fmt in ((k, FORMAT_OF[k]) for k in PARQUET_KINDS):
        for comp in [c.strip() for c in a.compressions.split(",") if c.strip()]:
            out = work / variant_dir(fmt, comp)
            t0 = time.perf_counter()
            m = pretokenize(corpus, tok, fmt, a.seq_len, comp, out)
            write_s = time.perf_counter() - t0
            reads = [read_parquet_files(out, m) for _ in range(max(1, a.read_repeats))]
            secs, nbytes = min(r[0] for r in reads), reads[0][1]
            disk, stored = sum(f["size"] for f in m["files"]), m["counts"]["tokens"]
            ld = bench_path(kind, str(out), None, a, 0, a.batches)
            rows.append({"format": fmt, "compression": comp, "disk_bytes": disk, "stored_tokens": stored,
                         "bytes_per_token": disk / stored, "decoded_bytes": nbytes, "read_s": secs,
                         "read_s_all": [r[0] for r in reads], "read_mb_per_s": nbytes / 1e6 / secs,
                         "read_tokens_per_s": stored / secs, "write_or_reuse_s": write_s,
                         "loader_setup_s": ld["setup_s"], "loader_tokens_per_s": ld["tokens_per_s"]})
            print(f"  {fmt} {comp}: {disk / 1e6:.1f} MB, read {secs:.3f} s, loader setup {ld['setup_s']:.2f} s",
                  flush=True)
    return rows


_num = fmt_num


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.2f}%"


def render(rows: list[list[str]]) -> str:
    """Aligned plain-text table (first column left-aligned)."""
    w = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w[i]) if i == 0 else c.rjust(w[i]) for i, c in enumerate(row)) for row in rows]
    return "\n".join([lines[0], "-" * len(lines[0]), *lines[1:]])


def loader_table(res: dict[str, dict]) -> str:
    """The loader throughput table: references and every path x worker count."""
    rows = [["path", "workers", "batches", "tokens/s", "eff tok/s", "batches/s", "pad frac", "masked frac",
             "setup s", "x ceiling", "x padded"]]
    for name, r in res.items():
        rows.append([name, str(r["workers"]), str(r["batches"]), _num(r["tokens_per_s"], True),
                     _num(r["effective_tokens_per_s"], True), _num(r["batches_per_s"]),
                     _pct(r["padding_fraction"]) if r["kind"] in KINDS and r["kind"] not in PACKED else "-",
                     _pct(r["masked_fraction"]) if r["kind"] in PACKED else "-",
                     _num(r.get("setup_s")), _num(r.get("x_ceiling")), _num(r.get("x_padded"))])
    return render(rows)


def compression_table(rows: list[dict]) -> str:
    """The parquet read table: one row per format x codec."""
    out = [["format", "compression", "file MB", "bytes/token", "read s", "read MB/s", "read tokens/s",
            "loader setup s", "loader tokens/s"]]
    for r in rows:
        out.append([r["format"], r["compression"], _num(r["disk_bytes"] / 1e6), _num(r["bytes_per_token"]),
                    _num(r["read_s"]), _num(r["read_mb_per_s"]), _num(r["read_tokens_per_s"], True),
                    _num(r["loader_setup_s"]), _num(r["loader_tokens_per_s"], True)])
    return render(out)


def targets(res: dict[str, dict], workers: list[int]) -> list[dict]:
    """The targets on tokens/s. Primary (what --check uses): pretok-memmap with 0 workers, in-process like
    the ceiling, and each path at its fastest worker count vs padded. With workers, informational: every batch then
    crosses a process boundary, a cost the in-process ceiling does not pay (see the "via DataLoader" reference)."""
    out = []

    def add(name: str, num: dict | None, den: dict | None, need: float, primary: bool) -> None:
        """The median of round i's num / den over the rounds, with its interval (the fastest runs' ratio for
        results without rounds)."""
        e = ratio_estimate(num["tokens_per_s_all"], den["tokens_per_s_all"]) if num and den and \
            len(num.get("tokens_per_s_all", ())) == len(den.get("tokens_per_s_all", ())) else None
        value = e["median"] if e else num["tokens_per_s"] / den["tokens_per_s"] if num and den else None
        out.append({"target": name, "value": value, "need": f">= {need:g}", "primary": primary,
                    "pass": None if value is None else value >= need, "estimate": e,
                    "interval": e and e["interval"], "n": e["n"] if e else int(value is not None),
                    "resolved": threshold_resolved(e, need)})

    def best(kind: str) -> dict | None:
        rows = [res[f"{kind} w{w}"] for w in workers if f"{kind} w{w}" in res]
        return max(rows, key=lambda r: r["tokens_per_s"]) if rows else None

    for w in workers:
        mm, primary = res.get(f"{MM} w{w}"), w == 0
        add(f"{MM} w{w} / raw memmap ceiling (in-process)", mm, res.get(CEIL), 0.5, primary)
        add(f"{MM} w{w} / {BASELINE} w{w}", mm, res.get(f"{BASELINE} w{w}"), 100.0, primary)
    m, p = best(MM), best(BASELINE)
    if m and p and len(workers) > 1:
        add(f"{MM} best (w{m['workers']}) / {BASELINE} best (w{p['workers']})", m, p, 100.0, True)
    return out


def main(args: argparse.Namespace) -> dict:
    """`pretok bench loaders`: `run` with the command line's config."""
    return run(from_args(LoadersBench, args))


def run(args: LoadersBench) -> dict:
    """Measure the references and every data path, then the compression variants; print, write `args.json`."""
    from ..tokenizer import load_tokenizer

    offline()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # DataLoader workers fork after the tokenizer ran
    if args.memory:  # bounded vs in-RAM parquet readers on given outputs, nothing else
        from .loaders_memory import main as memory_main

        rows = memory_main(args)
        write_json(args.json, {"memory": rows, "args": args.record()})
        check_targets(args, not all(r["rss_pass"] for r in rows if r["impl"] != "in-ram"))
        return {"memory": rows}
    kinds = [k.strip() for k in args.paths.split(",") if k.strip()]
    if [k for k in kinds if k not in KINDS] or not kinds:
        raise PretokError(f"--paths {args.paths!r}: choose among {', '.join(KINDS)}")
    work, corpus, tok = corpus_and_tokenizer(args)
    workers = [int(w) for w in str(args.workers).split(",") if w.strip()]
    info = load_tokenizer(tok)
    pre = work / f"pretok-s{args.seq_len}"
    outs, manifests = {}, {}
    for kind, fmt in FORMAT_OF.items():  # memmap always (the ceiling reads its data.bin), the rest if asked for
        if kind == MM or kind in kinds:
            outs[kind] = str(pre / variant_dir(fmt, TRAIN_COMPRESSION))
            manifests[fmt] = pretokenize(corpus, tok, fmt, args.seq_len, TRAIN_COMPRESSION, Path(outs[kind]))
    mm = manifests["memmap"]
    print(f"corpus {corpus}: {mm['counts']['documents']} docs, {mm['counts']['tokens']} tokens; tokenizer {tok}; "
          f"seq_len {args.seq_len}, micro-batch {args.micro_batch}", flush=True)

    res: dict[str, dict] = {}
    B, L = args.micro_batch, args.seq_len
    bin_path = Path(outs[MM]) / "data.bin"

    def reference(w: int, make_iter: Callable[[], Iterator[dict]]) -> Callable[[], dict]:
        return lambda: rates({"kind": "reference", "workers": w, **measure(make_iter, args.batches, args.warmup)})

    # every reference and path once per round, the rounds interleaved with their order rotated, each run probed
    fns: dict[str, Callable[[], dict]] = {
        CEIL: reference(0, lambda: nanogpt_batches(bin_path, mm["dtype"], L, B, args.seed)),
        RAND: reference(0, lambda: random_batches(info.vocab_size, L, B, args.seed))}
    for w in workers:
        if w > 0:
            fns[VIA.format(w)] = reference(w, lambda w=w: via_dataloader(RandomBatches(info.vocab_size, L, B,
                                                                                       args.seed), w))
        for kind in kinds:
            src = corpus if kind in SLOW else outs[kind]
            n = args.slow_batches if kind in SLOW else args.batches
            fns[f"{kind} w{w}"] = lambda kind=kind, src=src, w=w, n=n: bench_path(kind, src, tok, args, w, n)
    samples = rounds(list(fns), args.repeats, lambda name, k: fns[name](), args.probe)
    for name, rs in samples.items():
        r = res[name] = {**max(rs, key=lambda r: r["tokens_per_s"]),
                         "tokens_per_s_all": [x["tokens_per_s"] for x in rs],
                         "estimate": est_dict(estimate(x["tokens_per_s"] for x in rs))}
        if r["kind"] == "reference":
            r["setup_s"] = r["first_batch_s"]
        print(f"  {name}: {text(r['estimate'], '.4g')} tokens/s, setup {r['setup_s']:.2f} s", flush=True)
    if args.pace_ms > 0:
        from .loaders_paced import pace_path

        for name, r in res.items():
            if r["kind"] in KINDS:
                r.update(pace_path(r["kind"], corpus if r["kind"] in SLOW else outs[r["kind"]], tok, L, B, args.seed,
                                   r["workers"], args.paced_batches, args.warmup, args.pace_ms / 1e3))
                print(f"  {name}: paced every {args.pace_ms:g} ms: next() {1e3 * r.get('paced_batch_s', 0):.3f} ms "
                      f"median, {1e3 * r.get('paced_mean_batch_s', 0):.3f} mean (back to back "
                      f"{1e3 / r['batches_per_s']:.3f} ms)", flush=True)
    ceil = res[CEIL]["tokens_per_s"]
    for name, r in res.items():
        pad = res.get(f"{BASELINE} w{r['workers']}")
        r["x_ceiling"] = r["tokens_per_s"] / ceil
        r["x_padded"] = r["tokens_per_s"] / pad["tokens_per_s"] if pad and not name.startswith("ref:") else None

    comp = bench_compression(corpus, tok, args, pre) if args.compressions else []
    load = [round(x, 2) for x in os.getloadavg()]  # other processes skew the rates: say how busy the machine was
    print(f"\nloader throughput: {Path(corpus).name}, {info.spec}, seq_len {L}, micro-batch {B}; "
          f"load average {load[0]} (1 min), {usable_cpus()} cpus\n")
    print(loader_table(res))
    if comp:
        print("\n" + compression_table(comp))
    print("\n" + NOTES.format(n=args.batches, slow=args.slow_batches, warm=args.warmup, seed=args.seed, ceil=CEIL,
                              rand=RAND, rep=args.read_repeats, reps=args.repeats))
    tg = targets(res, workers)
    print()
    for t in tg:
        status = {True: "PASS", False: "FAIL", None: "N/A"}[t["pass"]]
        v = "n/a" if t["value"] is None else f"{t['value']:.2f}"
        e = f" {text(t['estimate'])}" if t.get("estimate") else ""
        print(f"  [{status}] {t['target']}: {v}{e} (need {t['need']}){'' if t['primary'] else ' (info)'}"
              + ("" if t["resolved"] else " (threshold inside the interval: noise decides)"))
    mach = probes_of(samples)
    print(machine_line(mach))
    result = {"machine": mach,
              "corpus": {"path": corpus, "documents": mm["counts"]["documents"], "tokens": mm["counts"]["tokens"]},
              "tokenizer": {"spec": tok, "info": info.to_dict()}, "seq_len": L, "micro_batch": B,
              "workers": workers, "load_average": load, "outputs": outs, "loaders": res, "compression": comp,
              "targets": tg, "environment": environment(), "args": args.record()}
    write_json(args.json, result)
    check_targets(args, any(t["pass"] is False for t in tg if t["primary"]))
    return result
