"""The study's last lines (figures written by this study, how to get PNGs) and `make demo`'s system packages:
scripts/install_system_deps.sh installs where root + apt-get allow and otherwise says so and goes on."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from pretok_lib.study.run import figure_counts, summary
from pretok_lib.study.steps import ROOT

SCRIPT = ROOT / "scripts" / "install_system_deps.sh"


def _study(tmp_path: Path, html: int, png: int, stale_png: int = 0, png_param: bool = True) -> tuple[Path, dict]:
    out = tmp_path / "study"
    figs = out / "figures"
    figs.mkdir(parents=True)
    started = time.time()
    for i in range(stale_png):                     # left by an earlier study: not counted
        p = figs / f"old{i}.png"
        p.write_bytes(b"png")
        os.utime(p, (started - 3600, started - 3600))
    for i in range(html):
        (figs / f"f{i}.html").write_text("<html>")
    for i in range(png):
        (figs / f"f{i}.png").write_bytes(b"png")
    record = {"profile": "quick", "study_dir": str(out), "parameters": {"png": png_param}, "notebooks": {},
              "seconds": 1.0, "figures": figure_counts(figs, started)}
    return out, record


def test_summary_counts_the_pngs_this_study_wrote(tmp_path):
    out, record = _study(tmp_path, html=3, png=3, stale_png=2)
    assert record["figures"] == {"html": 3, "png": 3}
    text = summary(out, record)
    assert f"figures: {out / 'figures'}/ (3 HTML, 3 PNG written by this study)" in text
    assert "no PNGs" not in text


def test_no_png_ends_with_one_line_saying_how_to_get_them(tmp_path, monkeypatch):
    monkeypatch.delenv("BROWSER_PATH", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))           # no Chromium anywhere
    out, record = _study(tmp_path, html=4, png=0, stale_png=1)
    last = summary(out, record).splitlines()[-1]
    assert last.startswith("no PNGs: no Chromium found; install it (as root: bash scripts/install_system_deps.sh "
                           "chromium")
    assert last.endswith(f"then rerun: pretok study --profile quick --out {out} --notebooks 05")
    assert "(4 HTML, 0 PNG written by this study)" in summary(out, record)
    out2, off = _study(tmp_path / "off", html=4, png=0, png_param=False)
    assert summary(out2, off).splitlines()[-1] == "no PNGs: the png parameter is off (--set png=true to write them)"


def _script(*args: str, user: str | None = None, script: Path = SCRIPT) -> subprocess.CompletedProcess:
    """The script with an empty PATH: no Chromium, SLURM or apt-get (a machine that has none of them). As another
    `user`, from a copy in a directory anyone may enter, in which it also runs: the checkout may sit where only root
    can (a `mktemp -d`, root's home), where `nobody` got "Permission denied" (exit 126) reaching the script."""
    with tempfile.TemporaryDirectory(prefix="pretok-deps-") as shared:
        where = Path(shared)
        if user:
            where.chmod(0o755)
            shutil.copy(script, where / script.name)
            (where / script.name).chmod(0o644)
            script = where / script.name
        cmd = ["/bin/bash", str(script), *args]
        if user:
            cmd = [shutil.which("runuser"), "-u", user, "--", *cmd]
        return subprocess.run(cmd, env={"PATH": str(where / "empty")}, cwd=where, capture_output=True, text=True,
                              timeout=120)


def test_install_script_without_apt_or_root_says_what_is_missing_and_goes_on(tmp_path):
    root_only = tmp_path / "root-only"            # a checkout only root may enter
    root_only.mkdir(mode=0o700)
    shutil.copy(SCRIPT, root_only / SCRIPT.name)
    for user in (None, "nobody") if os.geteuid() == 0 else (None,):     # root without apt-get; not root
        p = _script("chromium", user=user, script=root_only / SCRIPT.name)
        assert p.returncode == 0, p.stderr
        assert p.stderr.strip() == ("install_system_deps: missing chromium fonts-liberation; not installed "
                                    "(needs root and apt-get): install them yourself")
    p = _script()                         # `make test`: both groups
    assert p.returncode == 0 and "missing slurmctld slurmd slurm-client munge chromium" in p.stderr
    p = _script("chromium", "bogus")
    assert p.returncode == 2 and "unknown group 'bogus'" in p.stderr


def test_make_demo_installs_chromium_where_it_can_and_goes_on():
    recipe = (ROOT / "Makefile").read_text().split("\ndemo:", 1)[1].split("\n\n", 1)[0]
    assert "bash scripts/install_system_deps.sh chromium ||" in recipe       # a failed install does not stop it
    assert recipe.index("install_system_deps") < recipe.index("pretok study --profile quick")


def test_make_test_keeps_its_log_and_the_exit_status_of_pytest(tmp_path):
    """`make test` tees the suite's output into a log that a failed run keeps, and fails with pytest's status
    (pipefail: tee's 0 hid it). pytest here is a stand-in that prints its arguments and exits $FAKE_RC."""
    fake = tmp_path / "python"
    fake.write_text('#!/bin/bash\necho "stand-in $*"\nexit ${FAKE_RC:-0}\n')
    fake.chmod(0o755)
    for rc in (3, 0):
        log = tmp_path / "logs" / f"rc{rc}.log"
        p = subprocess.run(["make", "-s", "-o", "setup", "-o", "sysdeps", "test", f"PY={fake}", f"TEST_LOG={log}"],
                           cwd=ROOT, env={**os.environ, "FAKE_RC": str(rc)}, capture_output=True, text=True,
                           timeout=120)
        assert "stand-in -m pytest" in log.read_text() and "stand-in -m pytest" in p.stdout
        assert f"make test: {'failed; ' if rc else ''}log: {log}" in p.stdout, p.stdout
        assert (p.returncode != 0 and "Error 3" in p.stderr) if rc else p.returncode == 0, (p.returncode, p.stderr)
