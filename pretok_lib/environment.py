"""The software and machine a result was made with, recorded beside every output, run and benchmark."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from pathlib import Path

PACKAGES = ("numpy", "pyarrow", "tokenizers", "fastokens", "tiktoken", "sentencepiece", "mistral-common",
            "transformers", "datasets", "torch")
SLURM_VARS = ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT")


def git_commit() -> str | None:
    """The checkout's HEAD commit, or None outside a git checkout (an installed package)."""
    try:
        root = Path(__file__).resolve().parents[1]
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None
    except Exception:
        return None


def environment() -> dict:
    """Python, platform, host, CPUs this process may use, the installed versions of `PACKAGES`, the git commit
    and the SLURM job, if any."""
    import importlib.metadata  # here, not at import: ~15 ms that every worker would pay

    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return {"python": sys.version.split()[0], "platform": platform.platform(), "machine": platform.machine(),
            "hostname": socket.gethostname(), "cpus": len(os.sched_getaffinity(0)), "packages": versions,
            "git_commit": git_commit(), "slurm": {k: v for k, v in os.environ.items() if k in SLURM_VARS}}
