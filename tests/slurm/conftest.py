"""A real single-node SLURM for the tests of slurm/ (see ../shared/notes/INFRA.md for the measured recipe).

`slurm_cluster` (session): munged with its socket in a fresh world-traversable temp dir, slurmctld and slurmd
(`-D`, as root) from a generated slurm.conf naming this host with all its CPUs in one `debug` partition
(proctrack/linuxproc, task/none, cons_tres/CR_CPU, no accounting); waits until the node is idle and exports
SLURM_CONF. The finalizer cancels every job, waits for an empty queue, then stops slurmd, slurmctld and munged by
their PIDs (never by name) and restores the environment — also when tests failed; if pytest itself is killed,
the daemons get SIGTERM from the kernel (PR_SET_PDEATHSIG). Fast turn-around: sched_interval=1 (a job whose
dependency or requeue delay just cleared starts within a second, not at the next 60 s pass) and
cred_expire=5 (a requeued job may start again after 5 s instead of 120 s). Also registers the venv's Jupyter
kernel `pretok` if missing (slurm/notebook.sbatch's default).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from ..conftest import ROOT

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "sinfo", "srun")
SBIN = ("/usr/sbin", "/usr/local/sbin", "/sbin")


@dataclass
class Cluster:
    dir: Path
    conf: Path
    node: str
    cpus: int

    def log(self, name: str) -> str:
        p = self.dir / "log" / name
        return p.read_text(errors="replace") if p.exists() else ""


def _which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path=os.pathsep.join(SBIN))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _conf(d: Path, node: str, cpus: int) -> str:
    return f"""\
ClusterName=pretoktest
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/munge
AuthInfo=socket={d}/munge/munge.sock,cred_expire=5
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/run/slurmctld.pid
SlurmdPidFile={d}/run/slurmd.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
MailProg=/bin/true
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerParameters=sched_min_interval=0,batch_sched_delay=0,sched_interval=1
ReturnToService=2
MinJobAge=300
JobRequeue=1
KillWait=10
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def _die_with_parent() -> None:
    """In the child: SIGTERM when pytest dies without running finalizers (killed), so no daemon outlives it."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _start(cmd: list[str], log: Path, env: dict) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=log.open("ab"), stderr=subprocess.STDOUT, env=env, start_new_session=True,
                            preexec_fn=_die_with_parent)  # noqa: PLW1509 (no threads at this point)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def _queue(env: dict) -> list[str]:
    r = subprocess.run(["squeue", "-h", "-o", "%i"], check=False, capture_output=True, text=True, env=env, timeout=30)
    return r.stdout.split()


def _ensure_kernel() -> None:
    """Register the venv's Jupyter kernel `pretok` (papermill runs notebooks in it) if it is missing."""
    py = ROOT / ".venv" / "bin" / "python"
    if py.exists() and not (ROOT / ".venv" / "share" / "jupyter" / "kernels" / "pretok").exists():
        subprocess.run([str(py), "-m", "ipykernel", "install", "--sys-prefix", "--name", "pretok",
                        "--display-name", "Python (pretok)"], check=True, capture_output=True, timeout=120)


def pytest_collection_modifyitems(items) -> None:
    """Every test using the cluster is marked `slurm` (deselect with -m "not slurm")."""
    for item in items:
        if "slurm_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slurm)


@pytest.fixture(scope="session")
def slurm_cluster():
    missing = [b for b in BINARIES if _which(b) is None]
    if missing:
        pytest.skip(f"SLURM/munge binaries not found: {', '.join(missing)} "
                    "(scripts/install_system_deps.sh installs them)")
    if os.geteuid() != 0:
        pytest.skip("the test SLURM runs its daemons as root; not root here")
    d = Path(tempfile.mkdtemp(prefix="pretok-slurm-", dir="/tmp"))
    node, cpus = socket.gethostname().split(".")[0], len(os.sched_getaffinity(0))
    for sub in ("munge", "state", "spool", "run", "log"):
        (d / sub).mkdir()
    os.chmod(d, 0o755)  # munge: every folder on the path to its socket must be world-traversable
    os.chmod(d / "munge", 0o755)
    key = d / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    os.chmod(key, 0o400)
    conf = d / "slurm.conf"
    conf.write_text(_conf(d, node, cpus))
    env = dict(os.environ, SLURM_CONF=str(conf))
    env.pop("SLURM_JOB_ID", None)
    procs: list[subprocess.Popen] = []
    old = os.environ.get("SLURM_CONF")
    try:
        procs.append(_start([_which("munged"), "-F", f"--key-file={key}", f"--socket={d}/munge/munge.sock",
                             f"--pid-file={d}/run/munged.pid", f"--log-file={d}/log/munged.log",
                             f"--seed-file={d}/munge/munge.seed"], d / "log" / "munged.out", env))
        deadline = time.time() + 20
        while not (d / "munge" / "munge.sock").exists():
            if procs[0].poll() is not None or time.time() > deadline:
                raise RuntimeError(f"munged did not start: {(d / 'log' / 'munged.out').read_text()}")
            time.sleep(0.05)
        procs.append(_start([_which("slurmctld"), "-D", "-f", str(conf)], d / "log" / "slurmctld.out", env))
        procs.append(_start([_which("slurmd"), "-D", "-N", node, "-f", str(conf)], d / "log" / "slurmd.out", env))
        deadline, state = time.time() + 60, ""
        while state != "idle":
            if any(p.poll() is not None for p in procs) or time.time() > deadline:
                logs = "".join((d / "log" / f).read_text()[-2000:] for f in ("slurmctld.log", "slurmd.log")
                               if (d / "log" / f).exists())
                raise RuntimeError(f"SLURM node not idle (state {state!r}):\n{logs}")
            r = subprocess.run(["sinfo", "-h", "-o", "%T"], check=False, capture_output=True, text=True, env=env,
                               timeout=30)
            state = r.stdout.strip()
            time.sleep(0.2)
        _ensure_kernel()
        os.environ["SLURM_CONF"] = str(conf)
        yield Cluster(d, conf, node, cpus)
    finally:
        try:
            if len(procs) == 3 and all(p.poll() is None for p in procs):
                ids = _queue(env)
                if ids:
                    subprocess.run(["scancel", *ids], check=False, env=env, timeout=30)
                deadline = time.time() + 60
                while _queue(env) and time.time() < deadline:
                    time.sleep(0.25)
        finally:
            for p in reversed(procs):
                _stop(p)
            if old is None:
                os.environ.pop("SLURM_CONF", None)
            else:
                os.environ["SLURM_CONF"] = old
            shutil.rmtree(d, ignore_errors=True)
