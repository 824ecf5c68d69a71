"""What every output, run and benchmark records of the software that made it (`pretok_lib.environment`)."""

from __future__ import annotations

import re
from pathlib import Path

import pretok_lib
from pretok_lib.environment import environment

ROOT = Path(__file__).resolve().parents[1]


def test_the_versions_runs_md_promises_are_recorded() -> None:
    """run.json's "versions" (python + environment()["packages"]) holds every name docs/RUNS.md lists; pretok's own
    version was missing (only the git commit, None outside a checkout)."""
    listed = re.search(r'"versions": \{([^}]*)\}', (ROOT / "docs" / "RUNS.md").read_text()).group(1)
    names = [n.strip() for n in listed.replace("\n", " ").split(",") if n.strip() and n.strip() != "..."]
    env = environment()
    versions = {"python": env["python"], **env["packages"]}
    assert names and all(versions.get(n) for n in names), (names, versions)
    assert versions["pretok"] == pretok_lib.__version__
