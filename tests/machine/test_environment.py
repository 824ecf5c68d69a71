"""What every output, run and benchmark records of the software that made it (`pretok_lib.machine.environment`)."""

from __future__ import annotations

import re
from pathlib import Path

import pretok_lib
from pretok_lib.machine.environment import environment

ROOT = Path(__file__).resolve().parents[2]


def test_the_versions_runs_md_promises_are_recorded() -> None:
    """run.json's "versions" (python + environment()["packages"]) holds every name docs/RUNS.md lists; pretok's own
    version was missing (only the git commit, None outside a checkout)."""
    listed = re.search(r'"versions": \{([^}]*)\}', (ROOT / "docs" / "RUNS.md").read_text()).group(1)
    names = [n.strip() for n in listed.replace("\n", " ").split(",") if n.strip() and n.strip() != "..."]
    env = environment()
    versions = {"python": env["python"], **env["packages"]}
    assert names and all(versions.get(n) for n in names), (names, versions)
    assert versions["pretok"] == pretok_lib.__version__


def test_git_dirty_tells_a_commit_from_changed_code(tmp_path) -> None:
    """Records named the clean HEAD for code edited since (`git_commit` only): `git_dirty` says whether tracked
    files differ; untracked files are not code that ran; outside a checkout, None."""
    import subprocess

    from pretok_lib.machine.environment import git_commit, git_dirty

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                       capture_output=True)

    assert git_dirty(tmp_path) is None and git_commit(tmp_path) is None
    git("init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    git("add", "a.py")
    git("commit", "-q", "-m", "a")
    assert git_dirty(tmp_path) is False and re.fullmatch(r"[0-9a-f]{40}", git_commit(tmp_path))
    (tmp_path / "new.py").write_text("y = 2\n")
    assert git_dirty(tmp_path) is False                          # untracked
    (tmp_path / "a.py").write_text("x = 2\n")
    index = tmp_path / ".git" / "index"
    before = index.stat().st_mtime_ns, index.read_bytes()
    assert git_dirty(tmp_path) is True
    # read-only: a `git status` that refreshes the stale index writes it under index.lock (left behind by a kill)
    assert (index.stat().st_mtime_ns, index.read_bytes()) == before
    assert environment()["git_dirty"] in (True, False)           # this checkout
