"""The engine's CPU accounts of two source trees side by side: each tree's `pretok_lib` tokenizes the same cached
corpora (GPT-2, memmap), alternating trees in every round; prints the main process's streaming CPU, the workers'
CPU and the wall per size, and the main process's CPU slope per GB (least squares over all runs) of each tree.

usage: python scripts/ab_engine_cpu.py OLD_TREE NEW_TREE [--sizes 100,500,2000] [--repeats 3] [--workers 2]
       [--work /tmp/ab-engine] [--part-mb MB]   (OLD_TREE: e.g. a `git worktree add` of the commit before)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r'''
import json, shutil, sys, time
from pretok_lib.pretokenize import TokenizeConfig, run_tokenize
corpus, out, tok, w, part = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
shutil.rmtree(out, ignore_errors=True)
cfg = TokenizeConfig(inputs=[corpus], out=out, tokenizer=tok, workers=w, progress=False,
                     part_mb=float(part) if part else None)
t0 = time.perf_counter(); m = run_tokenize(cfg); r = m["run"]
print(json.dumps({"wall": time.perf_counter() - t0, "gb": m["counts"]["input_bytes"] / 1e9, "units": len(m["parts"]),
                  "main": r["main_cpu_streaming_seconds"], "workers": r["workers_cpu_seconds"]}))
shutil.rmtree(out, ignore_errors=True)
'''


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old"), ap.add_argument("new")
    ap.add_argument("--sizes", default="100,500,2000"), ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2), ap.add_argument("--work", default="/tmp/ab-engine")
    ap.add_argument("--part-mb", default="")
    ap.add_argument("--tokenizer", default=str(Path(__file__).resolve().parents[2] / "shared/data/tokenizers/gpt2/tokenizer.json"))
    a = ap.parse_args()
    from pretok_lib.bench.common import cached_corpus

    work = Path(a.work)
    corpora = {mb: str(cached_corpus(work, float(mb))) for mb in a.sizes.split(",")}
    rows: dict[str, list[dict]] = {"old": [], "new": []}
    for k in range(a.repeats):
        for mb, corpus in corpora.items():
            for name in (("old", "new") if k % 2 == 0 else ("new", "old")):
                tree = getattr(a, name)
                p = subprocess.run([sys.executable, "-c", CHILD, corpus, str(work / f"out-{name}"), a.tokenizer,
                                    str(a.workers), a.part_mb], capture_output=True, text=True,
                                   env={**os.environ, "PYTHONPATH": tree, "HF_HUB_OFFLINE": "1"})
                if p.returncode:
                    sys.exit(f"{tree}: {p.stderr.strip().splitlines()[-1]}")
                rows[name].append({"mb": mb, **json.loads(p.stdout.strip().splitlines()[-1])})
    for name, rs in rows.items():
        for mb in corpora:
            r = [x for x in rs if x["mb"] == mb]
            print(f"{name} {mb} MB ({r[0]['units']} units): main streaming CPU {[x['main'] for x in r]} s, workers "
                  f"{[x['workers'] for x in r]} s, wall {[round(x['wall'], 2) for x in r]} s")
        if len(corpora) > 1:
            slope = statistics.linear_regression([x["gb"] for x in rs], [x["main"] for x in rs])
            print(f"{name}: main CPU slope {slope.slope:.3f} s/GB, intercept {slope.intercept:.3f} s")


if __name__ == "__main__":
    main()
