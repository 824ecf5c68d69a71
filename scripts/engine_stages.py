"""A worker's path taken apart: the stages a memmap worker runs, in one process on one pinned core, with no queues,
threads or other processes, each timed in CPU seconds per GB of text. What encoding's share of the sum is bounds
what any engine that reads the same input and writes the same output on the same cores can reach against the
in-memory ceiling (which times encoding alone): wN / ceiling <= encode / total.

Stages, per row group of the text column: read (Parquet decompress + decode to an Arrow string array), str (Arrow to
Python `str`, what the encoder takes), encode (the backend's `encode_batch`, ~--batch-mb batches), special (EOS/BOS
inserted and cast to the part's dtype, `engine.parts.add_special`), hash (XXH3-128 of the ids), write (the part
file), copy (the part copied into a data file with copy_file_range, then deleted: the placement).

usage: python scripts/engine_stages.py CORPUS.parquet TOKENIZER [--rounds 3] [--batch-mb 1] [--workdir /tmp]
Prints each round, then per stage the median CPU-s/GB with its range over the rounds, and the bound.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np
import pyarrow.parquet as pq
import xxhash

from pretok_lib.analysis.uncertainty import estimate
from pretok_lib.engine.parts import add_special
from pretok_lib.sources.arrow_text import byte_lengths
from pretok_lib.tokenizer import id_dtype_for, limit_threads_to_one_cpu, load_tokenizer, make_encoder

STAGES = ("read", "str", "encode", "special", "hash", "write", "copy")


def one_round(corpus: str, enc, eos: int | None, dtype: np.dtype, batch_bytes: int, workdir: str) -> dict[str, float]:
    """CPU seconds per GB of text of each stage over the whole corpus, once."""
    cpu, spent, text = time.process_time, dict.fromkeys(STAGES, 0.0), 0
    pf = pq.ParquetFile(corpus)
    with tempfile.TemporaryDirectory(dir=workdir) as d:
        part = os.path.join(d, "part.bin")
        with open(part, "wb") as fh:
            for rg in range(pf.metadata.num_row_groups):
                t = cpu()
                arr = pf.read_row_group(rg, columns=["text"], use_threads=False).column(0).combine_chunks()
                spent["read"] += cpu() - t
                ends = np.cumsum(byte_lengths(arr))
                start = 0
                while start < len(arr):
                    base = int(ends[start - 1]) if start else 0
                    stop = max(start + 1, int(np.searchsorted(ends, base + batch_bytes, side="right")))
                    text += int(ends[stop - 1]) - base
                    t = cpu()
                    texts = arr.slice(start, stop - start).to_pylist()
                    spent["str"] += cpu() - t
                    start = stop
                    t = cpu()
                    ids, offsets = enc.encode_batch(texts)
                    spent["encode"] += cpu() - t
                    t = cpu()
                    ids, offsets = add_special(ids, offsets, None, eos, dtype)
                    spent["special"] += cpu() - t
                    t = cpu()
                    xxhash.xxh3_128(ids).digest()
                    spent["hash"] += cpu() - t
                    t = cpu()
                    fh.write(memoryview(ids))
                    spent["write"] += cpu() - t
        t = cpu()
        src, dst = os.open(part, os.O_RDONLY), os.open(os.path.join(d, "data.bin"), os.O_WRONLY | os.O_CREAT)
        left = os.fstat(src).st_size
        while left:
            left -= os.copy_file_range(src, dst, left)
        os.close(src)
        os.close(dst)
        os.unlink(part)
        spent["copy"] += cpu() - t
    return {k: v / (text / 1e9) for k, v in spent.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("corpus")
    ap.add_argument("tokenizer")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch-mb", type=float, default=1.0)
    ap.add_argument("--workdir", default=tempfile.gettempdir())
    args = ap.parse_args()
    limit_threads_to_one_cpu(0)
    info = load_tokenizer(args.tokenizer)
    dtype = np.dtype(id_dtype_for(info.vocab_size)).newbyteorder("<")
    rounds = []
    for r in range(args.rounds):
        enc = make_encoder(info, "fastokens")  # a fresh encoder each round, as each engine run and the ceiling have:
        enc.encode_batch(["warm up"])          # its caches warm from an earlier pass would make encoding cheaper
        s = one_round(args.corpus, enc, info.eos_id, dtype, int(args.batch_mb * 1e6), args.workdir)
        rounds.append(s)
        total = sum(s.values())
        print(f"round {r}: " + "  ".join(f"{k} {v:.2f}" for k, v in s.items())
              + f"  | total {total:.2f} CPU-s/GB, encode share {s['encode'] / total:.3f}", flush=True)
    print(f"\nCPU-s per GB of text, median [min, max] over {len(rounds)} rounds ({os.path.basename(args.corpus)}, "
          f"{info.spec}, one pinned core):")
    for k in (*STAGES, "total"):
        xs = [sum(s.values()) if k == "total" else s[k] for s in rounds]
        print(f"  {k:8s} {statistics.median(xs):6.2f} [{min(xs):.2f}, {max(xs):.2f}]")
    share = estimate(s["encode"] / sum(s.values()) for s in rounds)
    print(f"bound on wN / ceiling (encode / total): {share.median:.3f} [{share.lo:.3f}, {share.hi:.3f}], n={share.n}"
          f"; without the copy: {statistics.median(s['encode'] / (sum(s.values()) - s['copy']) for s in rounds):.3f}")


if __name__ == "__main__":
    main()
