"""`pretok bench loaders --memory KIND=DIR ...`: peak RSS per rank and throughput of the bounded parquet readers
beside the in-RAM readers they replaced (`data/inram.py`), on existing (large) outputs, in one run.

Each (dataset, reader) runs in a fresh process as rank 0 of `--memory-world` ranks with 0 DataLoader workers:
its peak RSS (VmHWM, whole process: Python, torch and pyarrow included) is what one rank of a node pays. Readers:
`in-ram` (every part loaded whole: the old path), `exact` (bounded, the same sample stream) and `block` (bounded,
`data.order: block`). A digest of the first batches checks that `exact` yields the in-RAM stream.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from typing import TYPE_CHECKING

from ..datapaths import REGISTRY
from ..errors import PretokError
from ..launch.procs import run_child
from ..machine.memory import peak_rss_mb
from . import fmt_num
from .common import at_least, positive

if TYPE_CHECKING:
    from .loaders import LoadersBench

IMPLS = ("in-ram", "exact", "block")
MEMORY_KINDS = tuple(p.name for p in REGISTRY if p.inram_reader)   # the paths whose in-RAM reader was replaced
RSS_GOAL_MB, SPEED_GOAL = 1024.0, 0.5
NOTES = """\
peak RSS: VmHWM of a fresh process reading as rank 0 of {world} (0 workers; DataLoader workers each hold their own
    cache), after construction and {n} timed batches; the goal is <= {rss:g} MB whatever the dataset size.
x in-RAM CPU: the same ratio per CPU second of the process (all its threads: the read-ahead's decoding included),
    steadier than wall time on a shared machine, where each process gets whatever share of the cores is free.
tokens/s: input slots of collated batches (B x seq_len) over {n} batches ({ne} for exact) after {w} warm-up batches;
    setup s: construction + first batch (the in-RAM readers load and checksum every part there; the bounded ones
    read footers, then checksum each part when first touched). x in-RAM: tokens/s / the in-RAM reader's (goal
    >= {speed:g} for the default block order; exact order decodes about one row group per sample once the data
    outgrows the cache). same stream: digest of the first {d} batches equals the in-RAM reader's (exact order only)."""


def add_args(p: argparse.ArgumentParser, d: LoadersBench) -> None:
    """The --memory options of `pretok bench loaders`, with the defaults of `d`."""
    p.add_argument("--memory", action="append", default=list(d.memory), metavar="KIND=DIR",
                   help=f"only the memory benchmark, on this output ({', '.join(f'{k}=DIR' for k in MEMORY_KINDS)})")
    p.add_argument("--memory-world", type=at_least(1), default=d.memory_world, help="ranks simulated (rank 0 is measured)")
    p.add_argument("--memory-batches", type=at_least(1), default=d.memory_batches,
                   help="timed batches (in-ram, block): several block windows, so read-ahead is amortised")
    p.add_argument("--memory-exact-batches", type=at_least(1), default=d.memory_exact_batches,
                   help="timed batches (exact order)")
    p.add_argument("--cache-mb", type=positive, default=d.cache_mb, help="decoded row-group cache per process")
    p.add_argument("--block-groups", type=at_least(1), default=d.block_groups, help="row groups per block-order window")


def one(spec: dict) -> dict:
    """Run in the child: build the reader, time batches, report peak RSS."""
    from ..data.loader import ShardedBatches, StatefulLoader
    from ..data.pretokenized import BLOCK_GROUPS, CACHE_MB
    from ..datapaths import BY_NAME, load

    base = peak_rss_mb()
    t0 = time.perf_counter()
    kind, impl, path, L = spec["kind"], spec["impl"], spec["path"], spec["seq_len"]
    kw = {"seed": spec["seed"], "shuffle": True}
    if impl == "in-ram":
        src = load(BY_NAME[kind].inram_reader)(path, L, **kw)
    else:
        src = BY_NAME[kind].reader_class()(path, L, order=impl, cache_mb=spec["cache_mb"] or CACHE_MB,
                  block_groups=spec["block_groups"] or BLOCK_GROUPS, **kw)
    it = iter(StatefulLoader(ShardedBatches(src, spec["micro_batch"], 0, spec["world"]), 0, False))
    digest, n = hashlib.sha256(), spec["batches"]
    first = next(it)
    setup = time.perf_counter() - t0
    digest.update(first["input_ids"].numpy().tobytes())
    for i in range(spec["warmup"]):
        b = next(it)
        if i + 1 < spec["digest_batches"]:
            digest.update(b["input_ids"].numpy().tobytes())
    t1, c1, tokens = time.perf_counter(), time.process_time(), 0
    for _ in range(n):
        tokens += int(next(it)["tokens"])
    secs, cpu = time.perf_counter() - t1, time.process_time() - c1
    return {"kind": kind, "impl": impl, "setup_s": setup, "tokens_per_s": tokens / secs, "batches": n,
            "tokens_per_cpu_s": tokens / cpu,
            "peak_rss_mb": peak_rss_mb(), "rss_at_start_mb": base, "digest": digest.hexdigest()[:16],
            "decoded": getattr(getattr(src, "rows", None), "decoded", None)}


def main(a: LoadersBench) -> list[dict]:
    """Every KIND=DIR x reader in its own process; print the table and targets."""
    rows = []
    for item in a.memory:
        kind, _, path = item.partition("=")
        if kind not in MEMORY_KINDS:
            raise PretokError(f"--memory {item}: KIND is one of {', '.join(MEMORY_KINDS)}")
        for impl in IMPLS:
            spec = {"kind": kind, "path": path, "impl": impl, "seq_len": a.seq_len, "micro_batch": a.micro_batch,
                    "world": a.memory_world, "seed": a.seed, "warmup": max(a.warmup, 20), "digest_batches": 20,
                    "batches": a.memory_exact_batches if impl == "exact" else a.memory_batches,
                    "cache_mb": a.cache_mb, "block_groups": a.block_groups}
            out = run_child([sys.executable, "-m", __name__, json.dumps(spec)], capture_output=True, text=True)
            if out.returncode:
                last = (out.stderr.strip().splitlines() or ["(no output)"])[-1]
                raise PretokError(f"the {impl} reader failed (exit {out.returncode}): {last}", path)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append(r)
            print(f"  {kind} {impl}: {r['tokens_per_s'] / 1e6:.3f} M tokens/s, peak RSS {r['peak_rss_mb']:.0f} MB, "
                  f"setup {r['setup_s']:.1f} s", flush=True)
    table = [["path", "reader", "setup s", "tokens/s", "x in-RAM", "x in-RAM CPU", "peak RSS MB", "same stream",
              "RSS ok", "speed ok"]]
    for r in rows:
        ram = next(x for x in rows if x["kind"] == r["kind"] and x["impl"] == "in-ram")
        r["x_in_ram"] = r["tokens_per_s"] / ram["tokens_per_s"]
        r["x_in_ram_cpu"] = r["tokens_per_cpu_s"] / ram["tokens_per_cpu_s"]
        r["rss_pass"] = r["peak_rss_mb"] <= RSS_GOAL_MB
        r["speed_pass"] = r["x_in_ram"] >= SPEED_GOAL
        r["same_stream"] = r["digest"] == ram["digest"] if r["impl"] == "exact" else None
        table.append([r["kind"], r["impl"], fmt_num(r["setup_s"]), fmt_num(r["tokens_per_s"], True),
                      fmt_num(r["x_in_ram"]), fmt_num(r["x_in_ram_cpu"]), f"{r['peak_rss_mb']:.0f}",
                      {True: "yes", False: "NO", None: "-"}[r["same_stream"]],
                      "PASS" if r["rss_pass"] else "FAIL", "PASS" if r["speed_pass"] else "FAIL"])
    w = [max(len(t[i]) for t in table) for i in range(len(table[0]))]
    lines = ["  ".join(c.ljust(w[i]) if i < 2 else c.rjust(w[i]) for i, c in enumerate(t)) for t in table]
    print("\n" + "\n".join([lines[0], "-" * len(lines[0]), *lines[1:]]))
    print("\n" + NOTES.format(world=a.memory_world, n=a.memory_batches, ne=a.memory_exact_batches,
                              w=max(a.warmup, 20), rss=RSS_GOAL_MB, speed=SPEED_GOAL, d=20))
    return rows


if __name__ == "__main__":
    print(json.dumps(one(json.loads(sys.argv[1]))))
