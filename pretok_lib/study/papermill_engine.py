"""`papermill --engine pretok`: papermill's nbclient engine with the kernel's channels encrypted
(`kernels.encrypted_kernel_channels`), for notebooks run by the papermill command (slurm/notebook.sbatch); `pretok
study` sets the same itself. Registered in pyproject.toml under the `papermill.engine` entry points."""

from __future__ import annotations

from typing import Any

from papermill.engines import NBClientEngine

from .kernels import encrypted_kernel_channels


class EncryptedChannelsEngine(NBClientEngine):
    @classmethod
    def execute_managed_notebook(cls, nb_man, kernel_name: str, **kwargs: Any):
        return super().execute_managed_notebook(nb_man, kernel_name, **{**encrypted_kernel_channels(), **kwargs})
