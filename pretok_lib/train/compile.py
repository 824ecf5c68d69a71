"""`torch.compile` with TorchInductor's on-disk cache kept apart per CPU kind.

Inductor's cache key (torch 2.13) holds the torch version, the graph and the config, but nothing of the CPU. So a
graph compiled where AVX-512 is picked, served from a shared `TORCHINDUCTOR_CACHE_DIR` to a process that picks
AVX2 (an AVX2-only node of the same cluster, or `ATEN_CPU_CAPABILITY=avx2`), runs its 16-lane loops on 8-lane
vectors and computes wrong values without any error: measured, a softmax off by 7.5 and a NaN loss at step 1.
Its kernels are also built with `-march=native`. Every compile here therefore uses a subdirectory of the cache
named by the CPU kind (architecture, CPU model and flags, the kernel-selecting environment).
"""

from __future__ import annotations

import hashlib
import os
import platform
import re

import torch

from .hardware import cpu_identity

KIND_NAME = re.compile(r"cpu-[a-z0-9_]+-[0-9a-f]{10}")   # what cpu_kind() returns


def cpu_kind() -> str:
    """A directory name for this CPU's kind: the architecture, then a hash of what decides which vector ISA
    Inductor picks and which instructions `-march=native` allows (CPU model and flags, the kernel-selecting
    environment). Computed without asking Inductor, whose ISA probes would be built in the shared cache."""
    facts = f"{platform.machine()}|{cpu_identity()}"
    arch = re.sub(r"[^a-z0-9_]+", "_", platform.machine().lower()) or "unknown"
    return f"cpu-{arch}-{hashlib.sha1(facts.encode()).hexdigest()[:10]}"


def use_cache_of_this_cpu() -> str:
    """Point `TORCHINDUCTOR_CACHE_DIR` at `<cache>/<cpu_kind()>`, where `<cache>` is the directory the user set (or
    Inductor's default); returns it. A variable already pointing at such a subdirectory (another run in this
    process, or a parent process that ran one) is taken back to its parent first, so directories never nest."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    base = os.path.abspath(os.environ.get("TORCHINDUCTOR_CACHE_DIR") or default_cache_dir())
    if KIND_NAME.fullmatch(os.path.basename(base)):
        base = os.path.dirname(base)
    path = os.path.join(base, cpu_kind())
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = path
    return path


def compile_model(net: torch.nn.Module) -> tuple[torch.nn.Module, str]:
    """`torch.compile(net)` whose compiled graphs and kernels are cached for this CPU kind only; and that cache's
    directory (recorded in run.json)."""
    cache = use_cache_of_this_cpu()
    return torch.compile(net), cache
