"""Process group set-up from the torchrun environment: NCCL on GPUs, gloo on CPU; one process without it."""

from __future__ import annotations

import ctypes
import datetime
import gc
import os
import signal
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class Dist:
    rank: int
    world: int
    local_rank: int
    device: torch.device
    backend: str | None           # None: a single process without a process group

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup(device: str | None = None) -> Dist:
    """Join the process group when launched by torchrun (RANK/WORLD_SIZE set); pick this rank's device.

    torchrun inside srun gives every node its rendezvous (see slurm/train.sbatch); nothing here reads SLURM."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device:
        dev = torch.device(device)
    elif torch.cuda.is_available():
        dev = torch.device("cuda", local_rank)
    else:
        dev = torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    backend = None
    if "TORCHELASTIC_RUN_ID" in os.environ:
        die_with_parent()
    if world > 1 or "TORCHELASTIC_RUN_ID" in os.environ:
        backend = "nccl" if dev.type == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=datetime.timedelta(minutes=30),
                                device_id=dev if dev.type == "cuda" else None)
        rank, world = dist.get_rank(), dist.get_world_size()
    return Dist(rank, world, local_rank, dev, backend)


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Get `sig` when the launcher (torchrun, which starts each rank in its own session) dies, even by SIGKILL:
    a rank then checkpoints and exits instead of running on as an orphan (Linux; a no-op elsewhere)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(sig))   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def all_reduce(t: torch.Tensor, op=None) -> torch.Tensor:
    """In-place all-reduce (sum by default) of a small tensor; a no-op without a process group. CPU tensors
    pass through this rank's GPU under NCCL (which reduces device tensors only)."""
    if not (dist.is_available() and dist.is_initialized()):
        return t
    op = op or dist.ReduceOp.SUM
    if t.device.type == "cpu" and dist.get_backend() == "nccl":
        on_gpu = t.to(torch.device("cuda", torch.cuda.current_device()))
        dist.all_reduce(on_gpu, op=op)
        t.copy_(on_gpu)
    else:
        dist.all_reduce(t, op=op)
    return t


def broadcast_object(obj, src: int = 0):
    if dist.is_available() and dist.is_initialized():
        box = [obj]
        dist.broadcast_object_list(box, src=src)
        return box[0]
    return obj


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def teardown() -> None:
    """Leave the process group; callers drop their model/optimizer first (gloo hangs on live references)."""
    gc.collect()
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
