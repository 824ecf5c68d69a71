"""pretok_lib/study/kernels.py: where kernels get encrypted channels. JupyterLab started with the config `make lab`
writes is tested end to end in tests/notebooks/test_notebooks.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pretok_lib.study import kernels


def test_lab_config_keeps_other_settings_and_is_removed_where_curve_is_missing(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "etc" / "jupyter" / kernels.LAB_CONFIG
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"ServerApp": {"port": 9999}, "KernelManager": {"shutdown_wait_time": 3}}))
    assert kernels.configure_lab(tmp_path) == path
    assert json.loads(path.read_text()) == {"ServerApp": {"port": 9999},
                                            "KernelManager": {"shutdown_wait_time": 3, "transport_encryption": "auto"}}
    monkeypatch.setattr(kernels, "curve_supported", lambda: False)
    kernels.configure_lab(tmp_path)      # jupyter_client would refuse to start any kernel with the setting left in
    assert json.loads(path.read_text()) == {"ServerApp": {"port": 9999}, "KernelManager": {"shutdown_wait_time": 3}}
    path.write_text(json.dumps({"KernelManager": {"transport_encryption": "auto"}}))
    kernels.configure_lab(tmp_path)
    assert json.loads(path.read_text()) == {}
    assert [p.name for p in path.parent.iterdir()] == [path.name]


@pytest.mark.parametrize("has_curve", [True, False])
def test_encryption_is_asked_for_only_where_curve_works(monkeypatch, has_curve: bool) -> None:
    import zmq

    monkeypatch.setattr(zmq, "has", lambda capability: has_curve)
    settings = kernels.encrypted_kernel_channels()
    assert kernels.curve_supported() is has_curve
    assert (settings["config"].KernelManager.transport_encryption == "auto") if has_curve else settings == {}
