"""The study's last lines (figures written by this study, how to get PNGs) and `make demo`'s system packages:
scripts/install_system_deps.sh installs where root + apt-get allow and otherwise says so and goes on."""

from __future__ import annotations

import os
import shutil
import subprocess
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


def _script(tmp_path: Path, *args: str, user: str | None = None) -> subprocess.CompletedProcess:
    """The script with an empty PATH: no Chromium, SLURM or apt-get (a machine that has none of them)."""
    cmd = ["/bin/bash", str(SCRIPT), *args]
    if user:
        cmd = [shutil.which("runuser"), "-u", user, "--", *cmd]
    return subprocess.run(cmd, env={"PATH": str(tmp_path / "empty")}, capture_output=True, text=True, timeout=60)


def test_install_script_without_apt_or_root_says_what_is_missing_and_goes_on(tmp_path):
    for user in (None, "nobody") if os.geteuid() == 0 else (None,):     # root without apt-get; not root
        p = _script(tmp_path, "chromium", user=user)
        assert p.returncode == 0, p.stderr
        assert p.stderr.strip() == ("install_system_deps: missing chromium fonts-liberation; not installed "
                                    "(needs root and apt-get): install them yourself")
    p = _script(tmp_path)                         # `make test`: both groups
    assert p.returncode == 0 and "missing slurmctld slurmd slurm-client munge chromium" in p.stderr
    p = _script(tmp_path, "chromium", "bogus")
    assert p.returncode == 2 and "unknown group 'bogus'" in p.stderr


def test_make_demo_installs_chromium_where_it_can_and_goes_on():
    recipe = (ROOT / "Makefile").read_text().split("\ndemo:", 1)[1].split("\n\n", 1)[0]
    assert "bash scripts/install_system_deps.sh chromium ||" in recipe       # a failed install does not stop it
    assert recipe.index("install_system_deps") < recipe.index("pretok study --profile quick")
