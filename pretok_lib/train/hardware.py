"""What the hardware computes fast: the precision `train.precision: auto` resolves to, and the peak FLOP/s that
MFU divides by (a GPU's datasheet figure, or the best matmul rate measured on this CPU).

CPU matmul rates (fp32, bf16, fp16) of one thread are measured once per CPU model and torch version (well under
a second) and cached in `$PRETOK_CACHE_DIR/cpu-matmul.json` (default: a per-user temp dir).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..machine.cpu_affinity import usable_cpus
from ..machine.environment import cpu_flags, cpu_model
from .flops import ACCELERATOR_TABLE, match_accelerator

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# CPU feature flags of native bf16 arithmetic: x86 (/proc/cpuinfo "flags") and aarch64 ("Features").
BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")
CPU_SIZES = (256, 512, 1024)
GPU_SIZES = (2048, 4096, 8192)
CACHE_FILE = "cpu-matmul.json"

# Dense peak TFLOP/s per device name substring (a view of flops.ACCELERATOR_TABLE, in its matching order): bf16,
# fp16, and fp32 = the TF32 figure.
PEAK_TFLOPS: dict[str, dict[str, float | None]] = {
    a.key: {p: a.tflops(p) for p in ("bf16", "fp16", "fp32")} for a in ACCELERATOR_TABLE}


@dataclass(frozen=True)
class Precision:
    """The precision a run computes in, what was asked for, and why."""
    used: str
    requested: str
    reason: str


def _gflops(x: float) -> str:
    return f"{x / 1e9:.3g}"


def best_matmul_flops(device: torch.device, dtype: torch.dtype, sizes: tuple[int, ...], budget_s: float) -> float:
    """The best FLOP/s of one square matmul in `dtype` over `sizes`, in about `budget_s` of wall time. On CPU it
    runs on one thread and is timed in that thread's CPU time, so other processes on a shared machine do not
    lower it; on a GPU each product is timed alone (synchronized). A larger size is tried only if it fits the
    budget. The global RNG is left alone."""
    cpu = device.type == "cpu"
    clock = time.thread_time if cpu else time.perf_counter
    shortest = 50 * time.get_clock_info("thread_time" if cpu else "perf_counter").resolution  # a readable time
    gen = torch.Generator().manual_seed(0)
    best, start = 0.0, time.perf_counter()
    per_size = budget_s / len(sizes)
    previous = torch.get_num_threads()
    if cpu:
        torch.set_num_threads(1)
    try:
        for i, n in enumerate(sizes):
            a = torch.randn(n, n, generator=gen).to(device, dtype)
            b = torch.randn(n, n, generator=gen).to(device, dtype)
            size_start, reps, fastest = time.perf_counter(), 0, float("inf")
            while True:
                t = clock()
                a @ b
                if not cpu:
                    torch.cuda.synchronize(device)
                dt = clock() - t
                if reps and dt >= shortest:  # the first product of a size warms up (allocation, kernel choice)
                    fastest = min(fastest, dt)
                    best = max(best, 2.0 * n**3 / dt)
                reps += 1
                now = time.perf_counter()
                if reps >= 3 and now - size_start >= per_size or reps >= 2 and now - start >= budget_s:
                    break
            grow = (sizes[i + 1] / n) ** 3 if i + 1 < len(sizes) else 0.0   # the next size: ~grow x longer
            if best and time.perf_counter() - start + 3 * fastest * grow > budget_s:
                break
    finally:
        torch.set_num_threads(previous)
    return best


def cache_path() -> Path:
    return Path(os.environ.get("PRETOK_CACHE_DIR") or Path(tempfile.gettempdir()) / f"pretok-{os.getuid()}") \
        / CACHE_FILE


# Settings that change which CPU kernels torch runs (e.g. ATEN_CPU_CAPABILITY=avx2 makes bf16 emulated on a CPU
# with native bf16): part of the cache key, so a rate measured under other kernels is never reused.
KERNEL_ENV = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


def cpu_identity() -> str:
    """What decides which CPU kernels run: the CPU model, a hash of its flags, the kernel-selecting environment."""
    flags = " ".join(sorted(cpu_flags()))
    kernels = "".join(f"|{k}={os.environ[k]}" for k in KERNEL_ENV if os.environ.get(k))
    return f"{cpu_model()}|flags {hashlib.sha1(flags.encode()).hexdigest()[:8]}{kernels}"


def _cache_key() -> str:
    return f"{cpu_identity()}|torch {torch.__version__}"


def _read_cache(path: Path) -> dict:
    try:
        cache = json.loads(path.read_text())
        return cache if isinstance(cache, dict) else {}
    except (OSError, ValueError):
        return {}


def cpu_matmul_rates(budget_s: float = 0.2) -> dict[str, float]:
    """Best measured matmul FLOP/s of one CPU thread per dtype (fp32, bf16, fp16): from the cache, else measured
    (about 3 x `budget_s`) and cached."""
    key, path = _cache_key(), cache_path()
    entry = _read_cache(path).get(key)
    rates = entry.get("rates") if isinstance(entry, dict) else None
    if isinstance(rates, dict) and all(isinstance(rates.get(k), (int, float)) and rates[k] > 0 for k in DTYPES):
        return {k: float(rates[k]) for k in DTYPES}
    rates = {k: best_matmul_flops(torch.device("cpu"), dt, CPU_SIZES, budget_s) for k, dt in DTYPES.items()}
    entry = {"cpu": cpu_model(), "torch": torch.__version__, "bf16_flags": sorted(cpu_flags() & set(BF16_FLAGS)),
             "unit": "FLOP/s of one thread", "rates": rates,
             "measured": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    try:   # a cache that cannot be written only costs the measurement next time
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({**_read_cache(path), key: entry}, indent=1) + "\n")
        os.replace(tmp, path)
    except OSError:
        pass
    return rates


def cpu_threads() -> int:
    """Threads a CPU run computes with: torch's intra-op threads, at most the CPUs this process may use."""
    return max(1, min(torch.get_num_threads(), usable_cpus()))


def _cuda_bf16(device: torch.device) -> bool:
    try:
        return torch.cuda.is_bf16_supported(including_emulation=False)
    except TypeError:   # older torch: no emulation to exclude
        return torch.cuda.is_bf16_supported()


def resolve_precision(requested: str, device: torch.device) -> Precision:
    """`requested` (fp32 | bf16 | fp16) as asked; `auto`: bf16 on GPUs that support it (else fp16 with a
    gradient scaler), bf16 on CPUs whose bf16 matmul measures at least as fast as fp32 (native bf16:
    avx512_bf16 / amx_bf16), else fp32."""
    if requested != "auto":
        return Precision(requested, requested, "requested")
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        if _cuda_bf16(device):
            return Precision("bf16", "auto", f"auto: {name} computes bf16 natively")
        cap = ".".join(map(str, torch.cuda.get_device_capability(device)))
        return Precision("fp16", "auto", f"auto: {name} (compute capability {cap}) has no native bf16: fp16 "
                                         "with a gradient scaler")
    if device.type != "cpu":
        return Precision("fp32", "auto", f"auto: fp32 on {device.type}")
    rates = cpu_matmul_rates()
    flags = sorted(cpu_flags() & set(BF16_FLAGS))
    has = f"bf16 flags {', '.join(flags)}" if flags else "no avx512_bf16/amx_bf16 flag"
    bf16, fp32 = rates["bf16"], rates["fp32"]
    measured = f"bf16 matmul {_gflops(bf16)} vs fp32 {_gflops(fp32)} GFLOP/s"
    if bf16 >= fp32:
        return Precision("bf16", "auto", f"auto: this CPU computes bf16 natively ({measured}; {has})")
    return Precision("fp32", "auto", f"auto: this CPU emulates bf16 ({measured}, {fp32 / bf16:.0f}x slower; "
                                     f"{has}): fp32")


def set_tf32(device: torch.device, tf32: bool) -> str | None:
    """CUDA: let fp32 matmuls use TF32 tensor cores (`train.tf32`, as nanoGPT and most GPU trainers do; without it an
    fp32 run computes in IEEE fp32 at a fraction of the datasheet's fp32 = TF32 peak). Returns the matmul precision
    set, None on other devices (CPUs keep IEEE fp32: 'high' could let oneDNN round fp32 matmuls to bf16)."""
    if device.type != "cuda":
        return None
    mode = "high" if tf32 else "highest"
    torch.set_float32_matmul_precision(mode)
    return mode


def peak_flops(device: torch.device, precision: str, override_tflops: float | None,
               tf32: bool = True) -> tuple[float, str]:
    """(per-device peak FLOP/s for MFU, where it came from): the override; a GPU's datasheet figure for the
    run's precision (fp32: TF32, when TF32 is on); else the best matmul rate measured on this device over every
    dtype it runs (the utilisation of the machine, not of the chosen dtype, so MFU <= 1 whatever the precision)."""
    if override_tflops:
        return override_tflops * 1e12, "hardware.peak_tflops"
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        if precision == "fp32" and not tf32:  # IEEE fp32 runs on the CUDA cores: no datasheet row for it here
            rate = best_matmul_flops(device, torch.float32, GPU_SIZES, 0.5)
            return rate, f"measured GPU fp32 matmul, TF32 off ({name}): {_gflops(rate)} GFLOP/s"
        acc = match_accelerator(name)
        peak = acc.tflops(precision if precision in ("fp32", "fp16") else "bf16") if acc else None
        if acc and peak:
            figure = "TF32" if precision == "fp32" else "fp16" if precision == "fp16" else "bf16"
            return peak * 1e12, f"datasheet {acc.key} dense {figure}"
        rates = {k: best_matmul_flops(device, dt, GPU_SIZES, 0.5) for k, dt in DTYPES.items()}
        best = max(rates, key=rates.get)
        return rates[best], (f"measured GPU matmul ({name}): best of "
                             f"{', '.join(f'{k} {_gflops(v)}' for k, v in rates.items())} GFLOP/s")
    rates, threads = cpu_matmul_rates(), cpu_threads()
    best = max(rates, key=rates.get)
    each = ", ".join(f"{k} {_gflops(v)}" for k, v in rates.items())
    return rates[best] * threads, (f"measured CPU matmul: best of {each} GFLOP/s per thread × {threads} "
                                   f"thread{'s' if threads > 1 else ''}")


def autocast_dtype(precision: str) -> torch.dtype | None:
    """The dtype a resolved precision autocasts to; None for fp32 (no autocast)."""
    return None if precision == "fp32" else DTYPES[precision]
