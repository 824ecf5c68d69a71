"""torch.compile's on-disk cache is kept apart per CPU kind: a graph compiled for one vector ISA and served from a
shared TORCHINDUCTOR_CACHE_DIR to a process that picks another computes wrong values (torch 2.13 keys its cache
without the CPU). The fault is injected by changing ATEN_CPU_CAPABILITY between two processes on one cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from torch._inductor import config as inductor_config
from torch._inductor.cpu_vec_isa import pick_vec_isa

from pretok_lib.train import compile as compile_mod

from ..conftest import ROOT

# Eager vs compiled on a row-wise logsumexp: a wide reduction, so a kernel built for the wrong vector width is
# far off (59.6 measured), not within rounding.
PROBE = r"""
import json, sys, torch
torch.set_num_threads(1)
torch.manual_seed(0)
class M(torch.nn.Module):
    def forward(self, x):
        return torch.logsumexp(x, -1)
m, x = M(), torch.randn(64, 1000)
if sys.argv[1] == "pretok":
    from pretok_lib.train.compile import compile_model
    c, cache = compile_model(m)
else:
    c, cache = torch.compile(m), None
print(json.dumps({"diff": (m(x) - c(x)).abs().max().item(), "cache": cache}))
"""


def _other_capability() -> str:
    """An ATEN_CPU_CAPABILITY whose Inductor vector ISA differs from the one this process picks (from the CPU flags,
    without Inductor's dry-compile of each ISA, as in `_probe`)."""
    with inductor_config.patch({"cpp.vec_isa_ok": True}):
        return "avx2" if pick_vec_isa().bit_width() > 256 else "default"


def _probe(how: str, cache: Path, capability: str | None) -> subprocess.CompletedProcess:
    """One process compiling PROBE on `cache`. Inductor's dry-compile of every vector ISA the CPU flags allow (a g++
    build each, 13 s of the probe's ~21 CPU-s, measured) is skipped: the flags alone pick the ISA, as they do when the
    builds succeed; the same setting in every probe keeps the graph's cache key the same, so the fault still shows."""
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache), OMP_NUM_THREADS="1", TORCHINDUCTOR_COMPILE_THREADS="1",
               TORCHINDUCTOR_VEC_ISA_OK="1")
    if capability is not None:
        env["ATEN_CPU_CAPABILITY"] = capability
    return subprocess.run([sys.executable, "-c", PROBE, how], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def _result(p: subprocess.CompletedProcess) -> dict:
    """The probe's {diff, cache}; it must have run."""
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(sys.platform != "linux" or os.uname().machine != "x86_64", reason="x86 vector ISAs")
def test_a_shared_inductor_cache_serves_each_cpu_kind_its_own_kernels(tmp_path):
    shared, other = tmp_path / "shared", _other_capability()
    first = _result(_probe("pretok", shared, None))
    mine = first["cache"]
    assert first["diff"] < 1e-4
    # The fault, shown without pretok: another kind of process on that very directory is served the first one's
    # graph and computes garbage (or, from AVX2 to no vectors, fails to build it).
    served = _probe("torch", Path(mine), other)
    assert served.returncode != 0 or _result(served)["diff"] > 1e-2, \
        "this torch keys its cache by CPU kind: the subdirectories of pretok_lib/train/compile.py may be dropped"
    # With pretok's compile on the shared cache: right, in a subdirectory of its own.
    second = _result(_probe("pretok", shared, other))
    theirs = second["cache"]
    assert second["diff"] < 1e-4
    assert theirs != mine and Path(theirs).parent == Path(mine).parent == shared
    assert sorted(p.name for p in shared.iterdir()) == sorted([Path(mine).name, Path(theirs).name])


def test_the_cache_directory_follows_the_cpu_kind_and_never_nests(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "base"))
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    first = compile_mod.use_cache_of_this_cpu()
    assert Path(first).parent == tmp_path / "base" and compile_mod.KIND_NAME.fullmatch(Path(first).name)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == first
    assert compile_mod.use_cache_of_this_cpu() == first        # a second run in this process: the same directory
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")       # another kind of kernels: a sibling, not a child
    other = compile_mod.use_cache_of_this_cpu()
    assert other != first and Path(other).parent == tmp_path / "base"
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")              # unset: under Inductor's own default
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    assert Path(compile_mod.use_cache_of_this_cpu()).parent == Path(default_cache_dir()).resolve()


def test_a_user_directory_named_like_a_kind_is_only_taken_back_when_it_is_one(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cpu-cache"))
    assert Path(compile_mod.use_cache_of_this_cpu()).parent == tmp_path / "cpu-cache"
