"""Check a DDP set-up (the original study's validate_ddp.py): after one step on different data per rank, every
rank must hold bit-identical gradients and parameters. Run it on the cluster before trusting throughput numbers:

    torchrun --nproc_per_node 4 -m pretok_lib.train.validate_ddp --data DATASET_DIR [--seq-len 256]
Exit code 0 when all checks pass.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.distributed as dist

from ..data import make_dataset
from ..datapaths import DEFAULT
from . import distributed
from .config import ModelConfig
from .loop import forward_loss_sum, source_tokenizer
from .model import build_model, vocab_size_for


def _digest(tensors) -> torch.Tensor:
    """A vector of per-tensor sums and sums of squares (float64): equal vectors ⇔ equal tensors, in practice."""
    return torch.stack([torch.stack([t.double().sum(), t.double().square().sum()]) for t in tensors]).flatten()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="a pretokenized dataset dir (memmap/token-list/padded)")
    ap.add_argument("--kind", default=DEFAULT)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--micro-batch", type=int, default=4)
    args = ap.parse_args(argv)
    d = distributed.setup()
    if d.world < 2:
        print("validate_ddp: run me with torchrun --nproc_per_node >= 2", file=sys.stderr)
        return 2
    data = make_dataset(args.kind, args.data, args.seq_len, micro_batch=args.micro_batch)
    arch = ModelConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2)
    model = build_model(arch, vocab_size_for(arch, source_tokenizer(data.source)[0]), args.seq_len, seed=0,
                        device=d.device)
    ids = [d.device.index] if d.device.type == "cuda" else None
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = next(iter(data))
    loss = forward_loss_sum(ddp, batch, d.device, "fp32") / max(batch["effective_tokens"], 1)
    loss.backward()

    def same_everywhere(vec: torch.Tensor) -> bool:
        vec = vec.to(d.device)
        gathered = [torch.empty_like(vec) for _ in range(d.world)]
        dist.all_gather(gathered, vec)
        return all(torch.equal(g, gathered[0]) for g in gathered)

    data_differs = not same_everywhere(batch["input_ids"].double().flatten()[:256])
    grads_equal = same_everywhere(_digest([p.grad for p in model.parameters()]))
    opt.step()
    params_equal = same_everywhere(_digest(list(model.parameters())))
    if d.is_main:
        yes = {True: "yes", False: "NO"}
        print(f"ranks saw different data: {yes[data_differs]}")
        print(f"gradients identical across {d.world} ranks: {yes[grads_equal]}")
        print(f"parameters identical after the step: {yes[params_equal]}")
    ok = data_differs and grads_equal and params_equal
    del ddp, model, opt
    distributed.teardown()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
