"""Every job step of every slurm/*.sbatch goes through the one launch prefix of slurm/common.sh: `srun <step flags>
$PRETOK_SRUN_EXTRA $PRETOK_CONTAINER`, so a container (apptainer, pyxis) or a uenv reaches tokenize, verify, merge,
papermill and nbconvert too, not only training (issue 36, item 10).

No cluster: the scripts run under bash with stand-ins on PATH. `srun` logs its arguments and runs the command after
its options with FAKE_SRUN=1; the container wrapper `fakectr exec IMAGE CMD...` runs CMD with FAKE_CTR=IMAGE;
PRETOK_PYTHON is a stand-in python that logs how it was reached. Generated settings (srun flags, container or
none, launch backend, inside a job or not); each script's log is parsed: every python call was a step of its own
with the flags and the container."""

from __future__ import annotations

import itertools
import os
import shlex
import subprocess
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .helpers import SLURM
from .test_slurm_lib import clean_env

FAKES = {
    "srun": """echo "SRUN $*" >> "$FAKE_LOG"
while [ $# -gt 0 ] && [[ $1 == -* ]]; do shift; done
FAKE_SRUN=1 exec "$@"
""",
    "fakectr": """[ "$1" = exec ] || { echo "fakectr: usage: fakectr exec IMAGE CMD" >&2; exit 2; }
echo "CTR $2" >> "$FAKE_LOG"
img=$2; shift 2
FAKE_CTR=$img exec "$@"
""",
    "python": """echo "PY srun=${FAKE_SRUN:-0} ctr=${FAKE_CTR:-} $*" >> "$FAKE_LOG"
case " $* " in
  *socket*) echo 29555 ;;
  *" -m papermill "*) cp "$3" "$4" ;;
esac
exit 0
""",
    "scontrol": 'echo node1\n',
}

FLAG = st.sampled_from(["--uenv=prgenv/24.7", "--view=default", "--container-image=nvcr.io#nvidia/pytorch:24.07",
                        "--container-mounts=/scratch", "--environment=pretok", "--mpi=pmi2", "--cpu-bind=none"])
SCRIPTS = ("merge", "pretokenize_array", "notebook", "train")


def fakes(d: Path) -> Path:
    b = d / "fakebin"
    b.mkdir(exist_ok=True)
    for name, body in FAKES.items():
        (b / name).write_text("#!/usr/bin/env bash\n" + body)
        (b / name).chmod(0o755)
    return b


def run_job(script: str, work: Path, env: dict[str, str], in_job: bool) -> list[str]:
    """Run slurm/<script>.sbatch with bash in `work`; returns the stand-ins' log lines."""
    log = work / "fake.log"
    log.unlink(missing_ok=True)
    (work / "shards" / "shard-00000").mkdir(parents=True, exist_ok=True)
    (work / "shards" / "shard-00000" / "manifest.json").write_text("{}")
    (work / "nb.ipynb").write_text("{}")
    args = {"merge": ["1", "shards", "merged"],
            "pretokenize_array": ["2", "shards", "in.jsonl", "--tokenizer", "t.json"],
            "notebook": ["nb.ipynb", "out"],
            "train": ["--config", "c.yaml", "run.id=x"]}[script]
    job = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node1", "SLURM_NNODES": "1", "SLURM_NTASKS_PER_NODE": "2",
           "SLURM_CPUS_ON_NODE": "4", "SLURM_ARRAY_TASK_ID": "0"}
    if not in_job:
        job = {"SLURM_ARRAY_TASK_ID": "0"} if script == "pretokenize_array" else {}
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PRETOK_"))}
    r = subprocess.run(["bash", str(SLURM / f"{script}.sbatch"), *args], cwd=work, capture_output=True, text=True,
                       timeout=60, env={**base, **env, **job, "FAKE_LOG": str(log), "PRETOK_ROOT": str(SLURM.parent)})
    assert r.returncode == 0, f"{script}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    return log.read_text().splitlines() if log.exists() else []


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(extra=st.lists(FLAG, max_size=3, unique=True), image=st.sampled_from(["", "/img/pretok.sif"]),
       backend=st.sampled_from(["torchrun", "srun"]), in_job=st.booleans())
def test_every_step_of_every_job_goes_through_the_launch_prefix(tmp_path, extra, image, backend, in_job):
    b = fakes(tmp_path)
    env = clean_env(PRETOK_SRUN_EXTRA=" ".join(extra), PRETOK_CONTAINER=f"fakectr exec {image}" if image else "",
                    PRETOK_PYTHON=str(b / "python"), PRETOK_LAUNCH_BACKEND=backend)
    env["PATH"] = f"{b}:{os.environ['PATH']}"
    for script in SCRIPTS:
        if script == "train" and not in_job:
            continue   # train.sbatch refuses to run outside a job
        lines = run_job(script, tmp_path, env, in_job)
        calls = [ln for ln in lines if ln.startswith("PY ")]
        steps = [shlex.split(ln)[1:] for ln in lines if ln.startswith("SRUN ")]
        assert calls, f"{script}: no python step ran\n{lines}"
        for call in calls:   # reached through srun (inside a job) and the container (when one is set)
            assert call.startswith(f"PY srun={int(in_job)} ctr={image} "), f"{script}: {call}\n{lines}"
        assert len(steps) == (len(calls) if in_job else 0), f"{script}: one srun step per python call\n{lines}"
        for argv in steps:   # srun <the step's own flags> <PRETOK_SRUN_EXTRA> <container or the command> ...
            flags = list(itertools.takewhile(lambda a: a.startswith("-"), argv))
            assert flags[len(flags) - len(extra):] == extra, f"{script}: {argv}"
            first = argv[len(flags)]
            assert first == "fakectr" if image else first in (str(b / "python"), "bash"), f"{script}: {argv}"
