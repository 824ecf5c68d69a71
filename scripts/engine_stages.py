"""A worker's path taken apart (`pretok_lib.bench.stages`): the stages a worker runs, in one process on one pinned
core, each timed in CPU seconds per GB of text; the same batches encoded alone (as the ceiling times them) over the
sum bounds wN / ceiling for any engine that reads the same input and writes the same output.

usage: python scripts/engine_stages.py CORPUS.parquet TOKENIZER [--format memmap] [--rounds 3] [--batch-mb 1]
       [--workdir /tmp] [--mb MB]
Prints each round, then per stage the median CPU-s/GB with its range over the rounds, and the bound.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile

from pretok_lib.bench.stages import STAGES, bounds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("corpus")
    ap.add_argument("tokenizer")
    ap.add_argument("--format", choices=sorted(STAGES), default="memmap")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch-mb", type=float, default=1.0)
    ap.add_argument("--workdir", default=tempfile.gettempdir())
    ap.add_argument("--mb", type=float, default=None, help="~this much text, every k-th row group of the file")
    args = ap.parse_args()
    max_bytes = None if args.mb is None else int(args.mb * 1e6)
    b = bounds(args.corpus, args.tokenizer, "fastokens", [args.format], args.rounds, int(args.batch_mb * 1e6),
               args.workdir, max_bytes)[args.format]
    for r, s in enumerate(b["rounds"]):
        total = sum(s.values())
        print(f"round {r}: " + "  ".join(f"{k} {v:.2f}" for k, v in s.items())
              + f"  | total {total:.2f} CPU-s/GB, encode share {s['encode'] / total:.3f}", flush=True)
    print(f"\nCPU-s per GB of text, median [min, max] over {len(b['rounds'])} rounds ({os.path.basename(args.corpus)}, "
          f"{args.tokenizer}, {args.format}, one pinned core):")
    for k in (*STAGES[args.format], "total"):
        xs = [sum(s.values()) if k == "total" else s[k] for s in b["rounds"]]
        print(f"  {k:8s} {statistics.median(xs):6.2f} [{min(xs):.2f}, {max(xs):.2f}]")
    lo, hi = b["encode_share"]["interval"]
    print(f"encode / total: {b['encode_share']['median']:.3f} [{lo:.3f}, {hi:.3f}]; the same batches encoded alone "
          f"(in memory, as the ceiling): {b['alone']:.2f} CPU-s/GB")
    lo, hi = b["bound"]["interval"]
    print(f"bound on wN / ceiling (encoding alone / total): {b['bound']['median']:.3f} [{lo:.3f}, {hi:.3f}], "
          f"n={b['bound']['n']}")


if __name__ == "__main__":
    main()
