"""A real 2-process DDP run (gloo on localhost): rank and world come from torch.distributed, not arguments. For
every data path the two ranks' samples are disjoint, together cover the epoch's full global batches in the
global order, and both ranks yield the same number of batches (checked across processes with all_gather)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

from pretok_lib.data import KINDS

from ..conftest import ROOT
from .helpers import GPT2, flatten_steps, multiset, ref_rows

SEQ, MB, SEED = 48, 3, 13

WORKER = textwrap.dedent("""
    import json, os, sys
    import torch
    import torch.distributed as dist
    from pretok_lib.data import dist_rank_world, make_dataset, make_loader

    port, out, spec = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    result = {"dist": list(dist_rank_world())}
    for name, (kind, path, num_workers, kw) in spec.items():
        ds = make_dataset(kind, path, kw.pop("seq_len"), **kw)  # no rank/world: they come from torch.distributed
        assert (ds.rank, ds.world) == (rank, 2), (ds.rank, ds.world)
        loader = make_loader(ds, num_workers=num_workers)
        batches = [b["input_ids"].tolist() for b in loader]
        counts = [torch.zeros(1, dtype=torch.int64) for _ in range(2)]
        dist.all_gather(counts, torch.tensor([len(batches)]))
        result[name] = {"batches": batches, "counts": [int(c) for c in counts],
                        "position": loader.state_dict()["position"]}
    dist.barrier()
    del loader, ds  # INFRA.md: drop torch objects and collect before teardown (gloo can abort at exit otherwise)
    import gc; gc.collect()
    dist.destroy_process_group()
    with open(out, "w") as fh:
        json.dump(result, fh)
""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_process_gloo_ddp(wiki, tmp_path):
    spec = {}
    for kind in KINDS:
        path = str(wiki.path(kind))
        kw = {"seq_len": SEQ, "micro_batch": MB, "seed": SEED}
        if kind in ("padded", "padding-free"):
            kw["tokenizer"] = GPT2
        spec[kind] = (kind, path, 0, kw)
    spec["pretok-memmap, 2 workers"] = ("pretok-memmap", str(wiki.path("pretok-memmap")), 2,
                                        dict(spec["pretok-memmap"][3]))
    script = tmp_path / "ddp_worker.py"
    script.write_text(WORKER)
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               OMP_NUM_THREADS="1", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    procs = [subprocess.Popen([sys.executable, str(script), str(port), str(tmp_path / f"rank{r}.json"),
                               json.dumps(spec)], env=dict(env, RANK=str(r)), cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(2)]
    try:
        outs = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    res = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["dist"] for r in res] == [[0, 2], [1, 2]]
    for name, (kind, *_rest) in spec.items():
        per_rank = [[{"input_ids": _T(b)} for b in r[name]["batches"]] for r in res]
        expect = ref_rows(wiki, kind, SEQ, seed=SEED)
        S = len(expect) // (2 * MB)
        assert res[0][name]["counts"] == res[1][name]["counts"] == [S, S], name  # equal, seen by both ranks
        mine = [multiset(tuple(row) for b in r[name]["batches"] for row in b) for r in res]
        assert not (mine[0] & mine[1]), name  # disjoint
        assert mine[0] + mine[1] == multiset(expect[: S * 2 * MB]), name  # together: the whole epoch, once
        assert flatten_steps(per_rank) == expect[: S * 2 * MB], name  # in the global order
        assert res[0][name]["position"] == res[1][name]["position"] == {"epoch": 1, "consumed": 0, "cursor": None}


class _T(list):
    """A batch's input_ids as nested lists, quacking like the tensor `rows()` expects."""

    def tolist(self):
        return list(self)
