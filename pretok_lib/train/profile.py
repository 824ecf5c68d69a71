"""One training step under `torch.profiler` (`log.profile_step`): where the step's time goes, on the main rank.

Writes `<run>/profile-step<N>.txt` (the operators by self time on the device, the top 40) and `.json`: the step's
wall time, the device's busy time (the sum of its kernels' self times, as the profiler counts them) and that time
by kind of work (matmul, attention, optimizer, copies, Triton kernels that `torch.compile` generated, other), the
answer to "MFU is low: is it the matmuls, the rest, or the GPU waiting for the host?". On a CPU the CPU's self
times stand in for the device's.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from .distributed import Dist

# kind of work -> pattern on the kernel or operator name (first match wins; case-insensitive)
KINDS = (("attention", r"flash|fmha|attention|sdpa|cudnn.*(mha|attn)"),
         ("matmul", r"gemm|matmul|\bmm\b|addmm|bmm|nvjet|cutlass|xmma|sm\d+_.*(tn|nt|nn|tt)|linear"),
         ("optimizer", r"adam|multi_tensor|foreach"),
         ("copies", r"memcpy|memset|copy_|to_copy|(?<![a-z])cat|concat"),  # cat, not scatter
         ("cross_entropy", r"log_softmax|nll_loss|cross_entropy|softmax"),
         ("compiled_triton", r"^triton_|triton"),
         ("other", r"."))


def kind_of(name: str) -> str:
    """The kind of work of one kernel or operator name (`KINDS`)."""
    for kind, pattern in KINDS:
        if re.search(pattern, name, re.IGNORECASE):
            return kind
    return "other"


def _self_time_us(e, device: bool) -> float:
    """An event's self time in µs on the device (CUDA) or the CPU; torch's attribute names vary by version."""
    names = ("self_device_time_total", "self_cuda_time_total") if device else ("self_cpu_time_total",)
    for n in names:
        v = getattr(e, n, None)
        if v is not None:
            return float(v)
    return 0.0


def _on_device(e) -> bool:
    """A kernel, memcpy or memset that ran on the GPU: not the operator that launched it, nor a user annotation's
    span on the GPU timeline (`Optimizer.step#AdamW.step` spans the optimizer's kernels), which would count them
    twice (measured on an H200: busy 102% of the step's wall time with the annotation counted)."""
    return getattr(getattr(e, "device_type", None), "name", "CPU") != "CPU" and \
        not getattr(e, "is_user_annotation", False)


def summarize(events, wall_s: float, device: bool) -> dict:
    """The step's busy time by kind of work from `prof.key_averages()`: the GPU's kernels (device self times),
    or on a CPU the operators' CPU self times."""
    kernels = device and any(_on_device(e) for e in events)  # else (no kernel events): the operators' device time
    by_kind: dict[str, float] = {}
    top = []
    for e in events:
        if kernels and not _on_device(e):
            continue
        us = _self_time_us(e, device)
        if us <= 0:
            continue
        k = kind_of(e.key)
        by_kind[k] = by_kind.get(k, 0.0) + us / 1e6
        top.append((us / 1e6, e.key, int(e.count), k))
    busy = sum(by_kind.values())
    top.sort(reverse=True)
    return {"wall_s": wall_s, "busy_s": busy, "busy_frac": busy / wall_s if wall_s > 0 else None,
            "timed_on": ("device kernels" if kernels else "device, by operator") if device else "cpu",
            "by_kind_s": dict(sorted(by_kind.items(), key=lambda kv: -kv[1])),
            "by_kind_frac": {k: v / busy for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])} if busy else {},
            "top": [{"name": n[:120], "s": s, "calls": c, "kind": k} for s, n, c, k in top[:25]]}


@contextlib.contextmanager
def profiled(on: bool, stem: Path, d: Dist) -> Iterator[None]:
    """Run the body under the profiler when `on` (main rank only) and write `stem`.txt / .json; else nothing."""
    if not (on and d.is_main):
        yield
        return
    from torch.profiler import ProfilerActivity, profile

    cuda = d.device.type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        t0 = time.perf_counter()
        yield
        if cuda:
            torch.cuda.synchronize(d.device)
        wall = time.perf_counter() - t0
    try:  # a profile is a diagnosis: its failure (a profiler or torch version quirk) must not fail the run
        events = prof.key_averages()
        sort = ("self_device_time_total" if hasattr(events[0], "self_device_time_total") else
                "self_cuda_time_total") if cuda and len(events) else "self_cpu_time_total"
        stem.with_suffix(".json").write_text(json.dumps(summarize(events, wall, cuda), indent=1) + "\n")
        stem.with_suffix(".txt").write_text(events.table(sort_by=sort, row_limit=40))
    except Exception as e:  # noqa: BLE001
        stem.with_suffix(".json").write_text(json.dumps({"wall_s": wall, "error": f"{type(e).__name__}: {e}"}))
