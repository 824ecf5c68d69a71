"""Encrypted kernel channels for every way the notebooks run: `pretok study` (papermill in-process), notebook jobs
(`papermill --engine pretok`) and JupyterLab (`make lab`).

A Jupyter kernel talks ZeroMQ over TCP on localhost. Unencrypted, other users of a shared login node can read the
cells' code and outputs (they cannot run code: messages are signed), and ipykernel >= 7.4 warns so at every start.
jupyter_client >= 8.10 provisions CurveZMQ keys (`KernelManager.transport_encryption`) for kernelspecs that declare
support, as ipykernel's do. Where jupyter_client or pyzmq cannot, nothing is set and kernels run as before:
jupyter_client refuses the setting outright without Curve, so it must never be set blindly.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

LAB_CONFIG = "jupyter_server_config.json"   # read by JupyterLab / Jupyter Server from <prefix>/etc/jupyter


def curve_supported() -> bool:
    """Whether this environment's jupyter_client can provision Curve keys and its pyzmq can use them."""
    import zmq
    from jupyter_client.manager import KernelManager

    return "transport_encryption" in KernelManager.class_trait_names() and bool(zmq.has("curve"))


def encrypted_kernel_channels() -> dict[str, Any]:
    """papermill / nbclient keyword arguments that encrypt the kernel's channels; {} where unsupported."""
    from traitlets.config import Config

    if not curve_supported():
        return {}
    return {"config": Config({"KernelManager": {"transport_encryption": "auto"}})}


def configure_lab(prefix: str | Path = sys.prefix) -> Path:
    """Set `KernelManager.transport_encryption = "auto"` in `<prefix>/etc/jupyter/jupyter_server_config.json`, so
    that JupyterLab started from this environment runs its kernels on encrypted channels (where unsupported, the
    setting is removed again). Other settings in that file are kept; the file is replaced atomically."""
    path = Path(prefix) / "etc" / "jupyter" / LAB_CONFIG
    config = json.loads(path.read_text()) if path.exists() else {}
    manager = config.setdefault("KernelManager", {})
    if curve_supported():
        manager["transport_encryption"] = "auto"
    else:
        manager.pop("transport_encryption", None)
        if not manager:
            del config["KernelManager"]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(config, indent=2) + "\n")
    os.replace(tmp, path)
    return path


def main() -> None:
    """`make lab`: configure this environment's JupyterLab and say what it got."""
    written = configure_lab()
    state = "encrypted" if curve_supported() else "unencrypted (pyzmq without Curve)"
    print(f"JupyterLab kernels of {sys.prefix}: {state} channels ({written})")
