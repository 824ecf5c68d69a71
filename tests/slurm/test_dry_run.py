"""Dry runs of the SLURM submission (issue 36, item 10): slurm/submit.sh and slurm/pretokenize.sh `--dry-run`,
`pretok_lib.launch.slurm.submit(dry_run=True)` and `pretok sweep --launcher slurm --dry-run` print the full sbatch lines and
submit nothing (a stand-in sbatch first on PATH records any call; no slurmctld). GPUs asked for as
PRETOK_GPU_REQUEST says: `--gpus-per-node=N` or `--gres=gpu:N`. Settings are generated; the lines are parsed."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pretok_lib.launch import slurm
from pretok_lib.cli import main as cli_main
from pretok_lib.launch.sweep import expand_grid
from pretok_lib.launch.sweep_slurm import dry_run

from ..conftest import ROOT
from .helpers import SLURM
from .test_slurm_lib import clean_env, fake_bin

SETTINGS = st.fixed_dictionaries({
    "PRETOK_ACCOUNT": st.sampled_from(["", "a-123"]), "PRETOK_PARTITION": st.sampled_from(["", "normal", "debug"]),
    "PRETOK_TIME": st.sampled_from(["", "00:30:00"]), "PRETOK_NODES": st.sampled_from(["1", "2", "4"]),
    "PRETOK_GPUS_PER_NODE": st.sampled_from(["0", "1", "4"]),
    "PRETOK_GPU_REQUEST": st.sampled_from(["gpus-per-node", "gres"]),
    "PRETOK_SRUN_EXTRA": st.sampled_from(["", "--uenv=prgenv/24.7 --view=default", "--environment=pretok"]),
    "PRETOK_CONTAINER": st.sampled_from(["", "apptainer exec --nv /img/pretok.sif"]),
})


def no_sbatch(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """An env whose sbatch only records that it was called."""
    called = tmp_path / "sbatch-called"
    return fake_bin(tmp_path, "sbatch", f'echo "$@" >> {shlex.quote(str(called))}; echo 1'), called


def gpu_flags(tokens: list[str]) -> list[str]:
    return [t for t in tokens if t.startswith(("--gres", "--gpus-per-node"))]


def expected_gpus(s: dict[str, str], n: int | str | None = None) -> list[str]:
    n = s["PRETOK_GPUS_PER_NODE"] if n is None else n
    if int(n) == 0:
        return []
    return [f"--gres=gpu:{n}"] if s["PRETOK_GPU_REQUEST"] == "gres" else [f"--gpus-per-node={n}"]


def check_comments(text: str, s: dict[str, str]) -> None:
    step = next(line for line in text.splitlines() if line.startswith("#   every job step: srun"))
    for part in (s["PRETOK_SRUN_EXTRA"], s["PRETOK_CONTAINER"]):
        assert part in step, step


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(s=SETTINGS, shards=st.integers(1, 9))
def test_dry_runs_print_full_sbatch_lines_and_submit_nothing(tmp_path, s, shards):
    env, called = no_sbatch(tmp_path)
    env = {**os.environ, **env, **clean_env(**s)}
    r = subprocess.run(["bash", str(SLURM / "submit.sh"), "--dry-run", "--time=02:00:00", str(SLURM / "train.sbatch"),
                        "--config", "c 1.yaml", "run.id=x"], capture_output=True, text=True, env=env, cwd=tmp_path,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    line = shlex.split(r.stdout.splitlines()[0])
    script = line.index(str(SLURM / "train.sbatch"))
    assert line[0] == "sbatch" and line[script + 1:] == ["--config", "c 1.yaml", "run.id=x"]
    opts = line[1:script]
    assert f"--nodes={s['PRETOK_NODES']}" in opts and opts[-1] == "--time=02:00:00"   # the caller's flag last
    assert ("--account=a-123" in opts) == bool(s["PRETOK_ACCOUNT"])
    assert gpu_flags(opts) == expected_gpus(s)
    check_comments(r.stdout, s)
    assert "#   script's own options: --job-name=pretok-train" in r.stdout   # its #SBATCH lines

    r = subprocess.run(["bash", str(SLURM / "pretokenize.sh"), "--dry-run", str(shards), "out", "a.jsonl",
                        "--tokenizer", "t.json"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stdout.splitlines() if not ln.startswith("#")]
    assert [ln[:15] for ln in lines] == ["array=$(sbatch ", "merge=$(sbatch "] and all(ln.endswith(")") for ln in lines)
    array, merge = (shlex.split(ln[len("array=$("):-1]) for ln in lines)
    root = str(tmp_path / "out.shards")
    assert array[-6:] == [str(SLURM / "pretokenize_array.sbatch"), str(shards), root, "a.jsonl", "--tokenizer",
                          "t.json"]
    assert f"--array=0-{shards - 1}" in array and not gpu_flags(array)
    assert merge[-4:] == [str(SLURM / "merge.sbatch"), str(shards), root, str(tmp_path / "out")]
    assert "--dependency=afterok:$array" in merge   # runnable as printed: the array's id from the first line
    check_comments(r.stdout, s)
    assert not called.exists(), "a dry run called sbatch"


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(s=SETTINGS, worlds=st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=3, unique=True))
def test_sweep_dry_run_lines_follow_the_layout_and_the_gpu_request(tmp_path, s, worlds):
    env, called = no_sbatch(tmp_path)
    env |= clean_env(**s)
    gpus = int(s["PRETOK_GPUS_PER_NODE"])
    worlds = [w for w in worlds if gpus == 0 or w <= gpus or w % gpus == 0]
    points = expand_grid({}, {"world": worlds or [1]}, prefix="dry")
    lines = dry_run(points, tmp_path / "c.yaml", tmp_path / "runs", env=env)
    for p, text in zip(points, lines):
        tokens = shlex.split(text.splitlines()[0])
        per_node = p.world if gpus == 0 or p.world <= gpus else gpus
        assert f"--ntasks-per-node={per_node}" in tokens and f"--job-name={p.run_id}" in tokens
        assert f"--output={tmp_path / 'runs' / p.run_id / 'launcher.log'}" in tokens
        assert gpu_flags(tokens)[-1:] == expected_gpus(s, per_node if gpus else 0)   # the point's own, last
        args = tokens[tokens.index(str(slurm.SLURM_DIR / "train.sbatch")) + 1:]
        assert args[:2] == ["--config", str(tmp_path / "c.yaml")] and f"run.id={p.run_id}" in args
    assert not called.exists(), "a dry run called sbatch"


def test_pretok_sweep_slurm_dry_run_submits_nothing(tmp_path, monkeypatch, capsys):
    env, called = no_sbatch(tmp_path)
    for k, v in {**env, **clean_env(PRETOK_GPUS_PER_NODE="4", PRETOK_GPU_REQUEST="gres")}.items():
        monkeypatch.setenv(k, v)
    assert cli_main(["sweep", "--config", str(ROOT / "configs" / "tiny.yaml"), "--axis", "world=1,2", "--launcher",
                     "slurm", "--runs-dir", str(tmp_path / "runs"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "sweep-w1  [not run]  sbatch --parsable" in out and "--gres=gpu:2" in out and "sweep-w2" in out
    assert not called.exists() and not (tmp_path / "runs").exists()
