"""The software and machine a result was made with, recorded beside every output, run and benchmark."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from pathlib import Path

from .cpu_affinity import usable_cpus

PACKAGES = ("numpy", "pyarrow", "tokenizers", "fastokens", "tiktoken", "sentencepiece", "mistral-common",
            "transformers", "datasets", "torch")
SLURM_VARS = ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT")


def git_state(root: Path | None = None) -> tuple[str | None, bool | None]:
    """(HEAD commit, whether tracked files differ from it) of pretok's checkout (or `root`'s), from one `git status`;
    (None, None) outside a git checkout (an installed package)."""
    try:
        root = root or Path(__file__).resolve().parents[2]
        # read-only: a plain `git status` rewrites the index under .git/index.lock, which a process killed meanwhile
        # (or two at once) leaves behind, and every later git command in the checkout refuses to run
        out = subprocess.run(["git", "--no-optional-locks", "-C", str(root), "status", "--porcelain=v2", "--branch",
                              "--untracked-files=no"], capture_output=True, text=True, timeout=10)
    except Exception:
        return None, None
    if out.returncode != 0:
        return None, None
    lines = out.stdout.splitlines()
    oid = next((ln.split()[2] for ln in lines if ln.startswith("# branch.oid ")), None)
    return (oid if oid != "(initial)" else None), any(not ln.startswith("#") for ln in lines)


def git_commit(root: Path | None = None) -> str | None:
    """The checkout's HEAD commit (`git_state`)."""
    return git_state(root)[0]


def git_dirty(root: Path | None = None) -> bool | None:
    """Whether the checkout's tracked files differ from its HEAD (the code that ran is not `git_commit`'s)."""
    return git_state(root)[1]


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo ({} where there is none)."""
    out: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if not line.strip():
                    if out:
                        break
                    continue
                key, _, value = line.partition(":")
                out.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return out


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo; else what platform knows)."""
    info = _cpuinfo()
    return (info.get("model name") or info.get("Model") or info.get("CPU part") or platform.processor()
            or platform.machine() or "unknown CPU")


def cpu_flags() -> set[str]:
    """The CPU's feature flags (x86 `flags`, Arm `Features`)."""
    info = _cpuinfo()
    return set((info.get("flags") or info.get("Features") or "").split())


def environment() -> dict:
    """Python, platform, CPU model, host, CPUs this process may use, the versions of pretok and of the installed
    `PACKAGES`, the git commit (and whether tracked files differ from it) and the SLURM job, if any."""
    import importlib.metadata  # here, not at import: ~15 ms that every worker would pay

    from .. import __version__

    versions = {"pretok": __version__}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    commit, dirty = git_state()
    return {"python": sys.version.split()[0], "platform": platform.platform(), "machine": platform.machine(),
            "cpu_model": cpu_model(), "hostname": socket.gethostname(), "cpus": usable_cpus(),
            "packages": versions, "git_commit": commit, "git_dirty": dirty,
            "slurm": {k: v for k, v in os.environ.items() if k in SLURM_VARS}}
