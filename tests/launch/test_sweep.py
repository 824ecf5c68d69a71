"""Sweeps: grid expansion and run ids, launcher commands, skip-if-completed, failure recording and retry, timeouts
(with a stand-in trainer, tests/fake_train.py), and one real tiny training run once the trainer exists."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from pretok_lib.cli import main as cli_main
from pretok_lib.errors import PretokError
from pretok_lib.launch.sweep import (Grid, Point, command, expand_grid, parse_axis, parse_setting, run_id, run_sweep,
                                     sweep_threads, yaml_scalar)
from pretok_lib.machine.cpu_affinity import usable_cpus

from ..conftest import SIGNAL_CONVERSIONS, signals_turned_into, tiny_memmap

ROOT = Path(__file__).resolve().parents[2]
FAKE = "tests.fake_train"
ENV = {"PYTHONPATH": str(ROOT)}


@pytest.fixture()
def config(tmp_path: Path) -> Path:
    p = tmp_path / "cfg.yaml"
    p.write_text("data:\n  path: no-data-needed\n  tokenizer: none-needed\ntrain:\n  steps: 1\n")  # valid, never read
    return p


def test_grid_ids_readable_deterministic_and_ordered() -> None:
    grid = expand_grid({"train.steps": 5, "data.tokenizer": "tok.json"},
                       {"data": ["pretok-memmap", "padded"], "world": [1, 2], "micro_batch": [4],
                        "precision": ["fp32", "bf16"], "lr": [3e-4], "seq_len": [256]})
    ids = [p.run_id for p in grid]
    assert len(ids) == len(set(ids)) == 8
    assert ids[0] == "sweep-pretok-memmap-w1-mb4-fp32-lr3e-4-s256"
    assert "sweep-pretok-memmap-w2-mb4-bf16-lr3e-4-s256" in ids
    assert ids[-1] == "sweep-padded-w2-mb4-bf16-lr3e-4-s256"  # the first axis varies slowest
    p = grid[-1]
    assert p.world == 2 and p.get("data") == "padded" and p.get("train.lr") == 3e-4 and p.get("train.steps") == 5
    assert [run_id(q) for q in expand_grid({"train.steps": 5, "data.tokenizer": "tok.json"},
                                           {"data": ["pretok-memmap", "padded"], "world": [1, 2], "micro_batch": [4],
                                            "precision": ["fp32", "bf16"], "lr": [3e-4], "seq_len": [256]})] == ids


def test_grid_subsets_other_axes_linked_and_collisions() -> None:
    assert [p.run_id for p in expand_grid({}, {})] == ["sweep-w1"]
    assert [p.run_id for p in expand_grid({"world": 2}, {"lr": [1e-3, 1.5e-5, 0.1]}, prefix="x")] == \
        ["x-w2-lr1e-3", "x-w2-lr1.5e-5", "x-w2-lr1e-1"]
    g = expand_grid({}, {"train.grad_accum": [1, 2]})
    assert [p.run_id for p in g] == ["sweep-w1-grad_accum1", "sweep-w1-grad_accum2"]
    g = expand_grid({"data.path": "default"}, {"data": ["padded", "pretok-memmap"]},
                    linked={"data": {"padded": {"data.path": "corpus.parquet"}}})
    assert [p.get("data.path") for p in g] == ["corpus.parquet", "default"]
    assert g[0].cli_overrides() == ["data.path=corpus.parquet", "data.kind=padded"]
    g = expand_grid({}, {"seq_len": [64, 128]}, linked=lambda o: {"data.path": f"pad-{o['data.seq_len']}"})
    assert [p.get("data.path") for p in g] == ["pad-64", "pad-128"]
    with pytest.raises(PretokError, match="both get run id"):
        expand_grid({}, {"train.name": ["a/b", "a_b"]})
    with pytest.raises(PretokError, match="no values"):
        expand_grid({}, {"lr": []})
    with pytest.raises(PretokError, match="twice"):
        expand_grid({}, {"lr": [1], "train.lr": [2]})


@pytest.mark.parametrize("v", [3e-4, 1e-5, 0.1, 256, True, None, "pretok-memmap", "1", "true", "3e-4", "a: b",
                               [1, 2], "null"])
def test_yaml_scalar_round_trips(v) -> None:
    assert yaml.safe_load(yaml_scalar(v)) == v and "\n" not in yaml_scalar(v)


def test_commands() -> None:
    p1, p2 = expand_grid({"train.lr": 3e-4}, {"world": [1, 2]})
    c1 = command(p1, "c.yaml", runs_dir="R")
    assert c1 == [sys.executable, "-m", "pretok_lib.train", "--config", "c.yaml", "train.lr=0.0003",
                  "run.id=sweep-w1-lr3e-4", "run.dir=R"]
    c2 = command(p2, "c.yaml", runs_dir="R")
    assert c2[:6] == [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m"]
    assert c2[6:] == ["pretok_lib.train", "--config", "c.yaml", "train.lr=0.0003", "run.id=sweep-w2-lr3e-4",
                      "run.dir=R"]
    assert command(p2, "c.yaml", "slurm", "R") == c2[7:]
    with pytest.raises(PretokError, match="launcher"):
        command(p1, "c.yaml", "ssh")


def test_run_sweep_skips_completed_records_and_retries_failed(tmp_path: Path, config: Path) -> None:
    runs = tmp_path / "runs"
    grid = Grid(axes={"data": ["pretok-memmap", "padded"], "world": [1, 2]}, base={"train.steps": 1})
    bad = "sweep-padded-w1"
    res = run_sweep(config, grid, runs, module=FAKE, env={**ENV, "FAKE_FAIL_IDS": bad}, echo=None)
    assert [(p.run_id, s) for p, s in res] == [("sweep-pretok-memmap-w1", "completed"),
                                               ("sweep-pretok-memmap-w2", "completed"),
                                               (bad, "failed"), ("sweep-padded-w2", "completed")]
    assert sorted((runs / "sweep-pretok-memmap-w2" / "invocations.txt").read_text().split()) == ["0/2", "1/2"]
    over = json.loads((runs / "sweep-padded-w2" / "run.json").read_text())["overrides"]
    assert over["data.kind"] == "padded" and over["train.steps"] == "1" and over["run.dir"] == str(runs)
    rec = json.loads((runs / bad / "launcher.json").read_text())
    assert rec["point"]["run_id"] == bad and rec["attempts"][0]["status"] == "failed"
    assert "exit code 1" in rec["attempts"][0]["reason"] and "fake failure" in rec["attempts"][0]["reason"]
    assert "failing" in (runs / bad / "launcher.log").read_text()
    # one torch thread count per rank at every world size (issue 34: 2 threads at 1 rank vs 1 at 2), within the cores
    threads = {json.loads((runs / p.run_id / "run.json").read_text())["torch_threads"] for p, _ in res}
    assert threads == {str(sweep_threads(grid.points()))} and int(threads.pop()) * 2 <= usable_cpus()

    lines = []
    res = run_sweep(config, grid, runs, module=FAKE, env=ENV, echo=lines.append)  # next call: retry the failed one
    assert [s for _, s in res] == ["skipped", "skipped", "completed", "skipped"]
    assert "4 grid points, 3 already completed, 1 to run" in lines[0]
    assert (runs / "sweep-pretok-memmap-w1" / "invocations.txt").read_text() == "0/1\n"  # never repeated
    rec = json.loads((runs / bad / "launcher.json").read_text())
    assert [a["status"] for a in rec["attempts"]] == ["failed", "completed"]
    assert (runs / bad / "launcher.log").read_text().count("=== ") == 2  # one header per attempt, appended


def test_run_sweep_timeout_kills_the_run(tmp_path: Path, config: Path) -> None:
    res = run_sweep(config, expand_grid({}, {}), tmp_path / "runs", module=FAKE,
                    env={**ENV, "FAKE_SLEEP_S": "900"}, timeout_s=1.0, echo=None)
    assert [s for _, s in res] == ["failed"]
    rec = json.loads((tmp_path / "runs" / "sweep-w1" / "launcher.json").read_text())
    # stopped, not run out: the bound only catches a run left to its 900 s (a slow start under load is no failure)
    assert "timed out after 1 s" in rec["attempts"][0]["reason"] and rec["attempts"][0]["seconds"] < 300


def test_grid_yaml_and_cli(tmp_path: Path, config: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    gfile = tmp_path / "grid.yaml"
    gfile.write_text("prefix: g\nbase: {train.steps: 1}\naxes: {lr: [0.001, 0.0003]}\n")
    assert [p.run_id for p in Grid.from_yaml(gfile).points()] == ["g-w1-lr1e-3", "g-w1-lr3e-4"]
    assert parse_axis("data=padded,pretok-memmap") == ("data", ["padded", "pretok-memmap"])
    assert parse_axis("lr=1.0e-3") == ("lr", [1e-3])
    # PyYAML reads 1e-3, 10e-4, 1E-3 as strings: three run ids for one learning rate; now one number, refused twice
    assert parse_axis("lr=1e-3,10e-4,1E-3,-2e+1,x1e3") == ("lr", [1e-3, 1e-3, 1e-3, -20.0, "x1e3"])
    with pytest.raises(PretokError, match="both get run id sweep-w1-lr1e-3"):
        Grid(axes={"lr": parse_axis("lr=1e-3,10e-4")[1]}).points()
    assert parse_setting("data.path=/tmp/a,b.parquet") == ("data.path", "/tmp/a,b.parquet")  # not split at commas
    assert parse_setting("target_mfu=[3.5e-1, 4.5e-1]") == ("target_mfu", [0.35, 0.45])
    gexp = tmp_path / "exp.yaml"
    gexp.write_text("axes: {lr: [1e-3, 3e-4]}\n")
    assert Grid.from_yaml(gexp).axes["lr"] == [1e-3, 3e-4]
    with pytest.raises(PretokError):
        parse_axis("lr")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    runs = tmp_path / "runs"
    args = ["sweep", "--config", str(config), "--grid", str(gfile), "--axis", "world=1", "--runs-dir", str(runs),
            "--module", FAKE]
    assert cli_main(args + ["--dry-run"]) == 0
    assert "g-w1-lr1e-3" in capsys.readouterr().out and not runs.exists()
    assert cli_main(["sweep", "--config", str(tmp_path / "missing.yaml"), "--axis", "lr=1e-3", "--dry-run"]) == 1
    assert capsys.readouterr().err.endswith("missing.yaml: config file not found\n")  # as the sweep says
    assert cli_main(args + ["--dry-run", "--axis", "data=padded,pretok-memmap", "--path", "padded=c.parquet"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "data.path=c.parquet" in out[0] and "data.kind=padded" in out[0] and "data.path" not in out[-1]
    assert cli_main(args) == 0
    out = capsys.readouterr().out
    assert "g-w1-lr3e-4" in out and "completed" in out
    monkeypatch.setenv("FAKE_FAIL_IDS", "g-w1-lr1e-3")
    (runs / "g-w1-lr1e-3" / "run.json").unlink()
    assert cli_main(args) == 1
    assert "1 of 2 grid points failed: g-w1-lr1e-3" in capsys.readouterr().err


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory) -> Path:
    """A 1-step CPU run of a 1-layer model on 0.3 MB of stdlib source (memmap, 512-token BPE): no ../shared."""
    d = tmp_path_factory.mktemp("sweep-real")
    _, tok = tiny_memmap(d)
    cfg = d / "tiny-test.yaml"
    cfg.write_text(f"""\
model: {{hidden_size: 32, num_layers: 1, num_heads: 2, num_kv_heads: 1}}
data: {{kind: pretok-memmap, path: {d / 'memmap'}, tokenizer: {tok}, seq_len: 32, micro_batch: 2}}
train: {{steps: 1, warmup_steps: 1, precision: fp32}}
eval: {{every: 1, batches: 1, path: {d / 'memmap'}}}
log: {{tensorboard: false}}
checkpoint: {{every: 0}}
""")
    return cfg


@pytest.mark.slow
def test_real_tiny_runs_then_skipped(tiny_config: Path, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    grid = expand_grid({}, {"world": [1, 2], "precision": ["bf16"]})
    res = run_sweep(tiny_config, grid, runs, echo=None, timeout_s=300)
    logs = {p.run_id: (runs / p.run_id / "launcher.log").read_text() for p, _ in res}
    assert [(p.run_id, s) for p, s in res] == [("sweep-w1-bf16", "completed"), ("sweep-w2-bf16", "completed")], logs
    for p, _ in res:
        info = json.loads((runs / p.run_id / "run.json").read_text())
        assert info["status"] == "completed" and info["world_size"] == p.world
        assert (runs / p.run_id / "summary.json").is_file()
        assert yaml.safe_load((runs / p.run_id / "config.yaml").read_text())["train"]["precision"] == "bf16"
    assert json.loads((runs / "sweep-w2-bf16" / "run.json").read_text())["backend"] == "gloo"
    mtime = (runs / "sweep-w1-bf16" / "metrics.jsonl").stat().st_mtime_ns
    res = run_sweep(tiny_config, grid, runs, echo=None)
    assert [s for _, s in res] == ["skipped", "skipped"]
    assert (runs / "sweep-w1-bf16" / "metrics.jsonl").stat().st_mtime_ns == mtime


@pytest.mark.slow
def test_real_failure_is_recorded_with_the_trainers_error(tiny_config: Path, tmp_path: Path) -> None:
    """A point whose config is valid but whose run fails (its dataset is missing: only opening it tells)."""
    res = run_sweep(tiny_config, expand_grid({}, {"data.path": ["no-such-path"]}), tmp_path / "runs", echo=None)
    assert [s for _, s in res] == ["failed"]
    rdir = tmp_path / "runs" / res[0][0].run_id
    rec = json.loads((rdir / "launcher.json").read_text())
    assert "exit code 2" in rec["attempts"][0]["reason"]
    assert "no-such-path" in (rdir / "launcher.log").read_text()


def test_slurm_layout() -> None:
    from pretok_lib.launch.sweep import slurm_layout

    assert slurm_layout(2, 0) == {"nodes": 1, "ntasks_per_node": 2}  # CPU: all processes on one node
    assert slurm_layout(2, 4) == {"nodes": 1, "ntasks_per_node": 2, "gpus_per_node": 2}
    assert slurm_layout(8, 4) == {"nodes": 2, "ntasks_per_node": 4, "gpus_per_node": 4}
    with pytest.raises(PretokError, match="multiple"):
        slurm_layout(6, 4)


def _procs_naming(text: str) -> list[int]:
    """Pids of live (non-zombie) processes whose command line contains `text` (a scan of /proc)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmd and state != "Z":
            out.append(int(d.name))
    return out


def _start_sweep(tmp_path: Path, config: Path, world: int):
    """`pretok sweep` of one point (world ranks of the stand-in trainer sleeping 300 s), waited until every rank
    is up; returns the process and the run dir."""
    import os
    import subprocess
    import time

    runs = tmp_path / "runs"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FAKE_SLEEP_S": "300"}
    proc = subprocess.Popen([sys.executable, "-m", "pretok_lib.cli", "sweep", "--config", str(config), "--axis",
                             f"world={world}", "--runs-dir", str(runs), "--module", FAKE], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rdir = runs / f"sweep-w{world}"
    end = time.monotonic() + 300              # deadlines here only catch hangs: Python starts slowly under load
    while not all((rdir / f"pid.{r}").is_file() for r in range(world)):
        assert proc.poll() is None and time.monotonic() < end, proc.communicate()
        time.sleep(0.05)
    time.sleep(0.3)
    return proc, runs, rdir


def _gone(runs: Path, timeout: float = 300) -> bool:
    import time

    end = time.monotonic() + timeout
    while _procs_naming(f"run.dir={runs}"):
        if time.monotonic() > end:
            return False
        time.sleep(0.1)
    return True


@pytest.mark.parametrize("sig, world", [("SIGTERM", 2), ("SIGINT", 1), ("SIGHUP", 1)])
def test_a_stopped_sweep_stops_its_runs(tmp_path: Path, config: Path, sig: str, world: int) -> None:
    """SIGTERM/SIGINT/SIGHUP to `pretok sweep` reach the run (torchrun and its ranks, each in its own session):
    the run ends `interrupted`, nothing is left running, the sweep exits 3 with one line."""
    import signal

    proc, runs, rdir = _start_sweep(tmp_path, config, world)
    assert len(_procs_naming(f"run.dir={runs}")) == world + (world > 1)
    proc.send_signal(getattr(signal, sig))
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 3, err
    assert len(err.strip().splitlines()) == 1 and f"stopped by {sig}" in err and "Traceback" not in err, err
    assert _gone(runs, timeout=120), "processes of the run outlived the sweep"   # it waited for them: none left
    assert json.loads((rdir / "run.json").read_text())["status"] == "interrupted"
    rec = json.loads((rdir / "launcher.json").read_text())
    assert f"stopped by {sig}" in rec["attempts"][-1]["reason"]


@pytest.mark.parametrize("world", [1, 2])
def test_a_killed_sweep_takes_its_runs_down(tmp_path: Path, config: Path, world: int) -> None:
    """SIGKILL to the sweep (no handler runs): the run's launcher gets SIGTERM from the kernel
    (PR_SET_PDEATHSIG), stops like on a stop signal, and no process of it is left."""
    import signal

    proc, runs, rdir = _start_sweep(tmp_path, config, world)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=300)
    assert _gone(runs), "the run outlived its killed sweep"
    assert json.loads((rdir / "run.json").read_text())["status"] == "interrupted"


def test_completed_point_of_another_config_is_refused_not_reused(tmp_path: Path, monkeypatch, capsys) -> None:
    """A completed run under the point's id whose config differs (here the base config's learning rate changed)
    is not skipped as if it were this sweep's: the point fails with the difference named, nothing is launched;
    run.overwrite=true reruns it."""
    data, _ = tiny_memmap(tmp_path)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"data:\n  path: {data}\ntrain:\n  steps: 1\n  lr: 0.001\n")
    runs, env = tmp_path / "runs", {**ENV, "FAKE_SAVE_CONFIG": "1"}
    grid = Grid(axes={"world": [1, 2]}, base={"train.steps": 1})
    assert [s for _, s in run_sweep(cfg, grid, runs, module=FAKE, env=env, echo=None)] == ["completed"] * 2
    assert [s for _, s in run_sweep(cfg, grid, runs, module=FAKE, env=env, echo=None)] == ["skipped"] * 2

    cfg.write_text(cfg.read_text().replace("lr: 0.001", "lr: 0.002"))
    lines: list[str] = []
    res = run_sweep(cfg, grid, runs, module=FAKE, env=env, echo=lines.append)
    assert [s for _, s in res] == ["failed"] * 2
    assert "0 already completed, 0 to run, 2 refused" in lines[-1]
    assert all("holds a run of another config (train.lr: 0.001 -> 0.002)" in x for x in lines[:2]), lines
    assert (runs / "sweep-w1" / "invocations.txt").read_text() == "0/1\n"  # nothing launched
    rec = json.loads((runs / "sweep-w1" / "launcher.json").read_text())
    assert rec["attempts"][-1]["status"] == "failed" and "train.lr" in rec["attempts"][-1]["reason"]

    cfg.write_text(cfg.read_text().replace("lr: 0.002", "lr: 0.003"))  # the study's policy: run changed points again
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("FAKE_SAVE_CONFIG", "1")
    args = ["sweep", "--config", str(cfg), "--axis", "world=1,2", "--set", "train.steps=1", "--runs-dir", str(runs),
            "--module", FAKE]
    capsys.readouterr()
    assert cli_main(args) == 1 and "--rerun-changed starts such points over" in capsys.readouterr().out
    assert cli_main(args + ["--rerun-changed"]) == 0
    out = capsys.readouterr().out
    assert "starting it over" in out and "2 completed now" in out
    assert (runs / "sweep-w1" / "invocations.txt").read_text() == "0/1\n"  # the old directory was cleared
    assert "lr: 0.003" in (runs / "sweep-w1" / "config.yaml").read_text()
    with pytest.raises(PretokError, match="changed must be one of"):
        run_sweep(cfg, grid, runs, module=FAKE, env=env, echo=None, changed="ignore")

    cfg.write_text(cfg.read_text().replace("lr: 0.003", "lr: 0.004"))  # a dry run says what the sweep would do
    capsys.readouterr()
    assert cli_main(args + ["--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and all("[would be refused: " in x and "train.lr: 0.003 -> 0.004" in x for x in out), out
    assert cli_main(args + ["--dry-run", "--rerun-changed"]) == 0
    assert all("[would start over: " in x for x in capsys.readouterr().out.splitlines())

    cfg.write_text(cfg.read_text().replace("lr: 0.004", "lr: 0.002"))
    over = Grid(axes={"world": [1, 2]}, base={"train.steps": 1, "run.overwrite": True})
    assert [s for _, s in run_sweep(cfg, over, runs, module=FAKE, env=env, echo=None)] == ["completed"] * 2
    assert (runs / "sweep-w1" / "invocations.txt").read_text() == "0/1\n0/1\n"  # the trainer starts over
    assert [s for _, s in run_sweep(cfg, grid, runs, module=FAKE, env=env, echo=None)] == ["skipped"] * 2


@pytest.mark.parametrize("turned_into", SIGNAL_CONVERSIONS)
@pytest.mark.parametrize("where", ["during a point", "between two points"])
def test_a_stop_signal_turned_into_another_error_still_stops_the_sweep(tmp_path: Path, config: Path, monkeypatch,
                                                                       capsys, turned_into: type,
                                                                       where: str) -> None:
    """The stop signal's exception turned into another error, while a point runs or after it: the sweep still
    ends as stopped (one line, exit 3, the attempt recorded), not as that error's traceback; later points never
    run; a sweep after it, failing the same way without a signal, is not taken for a stopped one."""
    import pretok_lib.launch.sweep as sweep

    runs = tmp_path / "runs"
    launched: list[str] = []

    def launch(cmd, log, env, timeout_s):
        launched.append(log.parent.name)
        if where == "during a point":
            signals_turned_into(turned_into)
        return 0, None

    def outcome(run_dir, rc, problem):
        signals_turned_into(turned_into)

    monkeypatch.setattr(sweep, "_launch_local", launch)
    if where == "between two points":
        monkeypatch.setattr(sweep, "_outcome", outcome)
    args = ["sweep", "--config", str(config), "--runs-dir", str(runs), "--axis", "train.lr=0.1,0.2"]
    assert cli_main(args) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "stopped by SIGTERM" in err, err
    assert ("during sweep-w1-lr1e-1" if where == "during a point" else "between two points") in err, err
    assert launched == ["sweep-w1-lr1e-1"]
    if where == "during a point":
        rec = json.loads((runs / launched[0] / "launcher.json").read_text())
        assert rec["attempts"][-1]["status"] == "failed" and "stopped by SIGTERM" in rec["attempts"][-1]["reason"]

    def failing(*a):
        raise turned_into("bad")

    monkeypatch.setattr(sweep, "_launch_local", failing)
    if turned_into in (OSError, PretokError):
        assert cli_main(args) == 1
        assert capsys.readouterr().err.startswith("pretok: error: ")
    else:
        with pytest.raises(turned_into):
            cli_main(args)


_YAML_TEXT = st.text(alphabet=st.sampled_from("[]{},:'\"&*!|>%@`#-? ab1.\\\t"), max_size=12)


@settings(max_examples=300, deadline=None)
@given(_YAML_TEXT)
def test_any_command_line_value_parses_or_is_one_line(text: str) -> None:
    """`--set` / `--axis` values of `pretok sweep` and `pretok study`: YAML, or a one-line PretokError naming the
    argument (a PyYAML exception reached the user as a traceback); a string value given back to the trainer
    (`yaml_scalar`) reads back as itself."""
    for parse in (lambda t: parse_setting(f"k={t}"), lambda t: parse_axis(f"k={t}")):
        try:
            parse(text)
        except PretokError as e:
            assert "\n" not in str(e) and str(e).startswith(("k:", "axis 'k=")), str(e)
    assert yaml.safe_load(yaml_scalar(text)) == text


@pytest.mark.parametrize("first", ["config.yaml", "checkpoints", "run.json"])
def test_a_stop_while_starting_a_changed_point_over_never_leaves_half_a_run(tmp_path: Path, monkeypatch,
                                                                           first: str) -> None:
    """--rerun-changed deletes the old run's directory; stopped (Ctrl-C, SIGTERM) half-way, that left e.g. a
    run.json saying completed without the config.yaml telling it was another config's run, and the next sweep
    skipped the point as completed with the old run's numbers. The directory is renamed aside first."""
    import shutil

    import pretok_lib.launch.sweep as sweep

    data, _ = tiny_memmap(tmp_path)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"data:\n  path: {data}\ntrain:\n  steps: 1\n  lr: 0.001\n")
    runs, env = tmp_path / "runs", {**ENV, "FAKE_SAVE_CONFIG": "1"}
    grid = Grid(axes={"world": [1]}, base={"train.steps": 1})
    assert [s for _, s in run_sweep(cfg, grid, runs, module=FAKE, env=env, echo=None)] == ["completed"]
    (runs / "sweep-w1" / "checkpoints").mkdir()
    cfg.write_text(cfg.read_text().replace("lr: 0.001", "lr: 0.002"))
    real = shutil.rmtree

    def stopped_half_way(path, *a, **kw):   # deletes `first` of the run, then the stop arrives
        victim = Path(path) / first
        real(victim) if victim.is_dir() else victim.unlink()
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep.shutil, "rmtree", stopped_half_way)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(cfg, grid, runs, module=FAKE, env=env, echo=None, changed="rerun")
    monkeypatch.setattr(sweep.shutil, "rmtree", real)
    res = run_sweep(cfg, grid, runs, module=FAKE, env=env, echo=None)
    assert [s for _, s in res] == ["completed"]                      # run now under the new config
    assert "lr: 0.002" in (runs / "sweep-w1" / "config.yaml").read_text()
    assert [p.name for p in runs.iterdir() if p.name.startswith(".")] in ([], [f".sweep-w1.old-{os.getpid()}"])


def _out_of_range(key: str):
    """A value of config key `key` (train/config.py LIMITS) that its limit refuses."""
    from pretok_lib.train.config import LIMITS

    limit = LIMITS[key]
    return limit.lo if limit.lo_open else limit.lo - 1


_BAD_AXES = st.one_of(
    st.sampled_from(sorted(k for k in __import__("pretok_lib.train.config", fromlist=["LIMITS"]).LIMITS
                           if k != "data.mixture.weight")).map(lambda k: (k, _out_of_range(k))),
    st.sampled_from([("train.lrr", 1e-3), ("data.kind", "parquet"), ("train.precision", "fp64"),
                     ("data.seq_len", 2.5), ("data.seq_len", "long"), ("train.lr", float("nan")),
                     ("model.num_heads", 3), ("world", 0), ("world", 1.5), ("world", "two"), ("world", True)]))


@settings(max_examples=60, deadline=None)
@given(bad=_BAD_AXES, before=st.booleans())
def test_an_invalid_axis_point_is_refused_before_any_point_runs(tmp_path_factory, bad, before: bool) -> None:
    """An axis value the trainer refuses (any key out of its range, an unknown key, a wrong type, a bad world size)
    was launched as a real run, after the points before it ran, before the sweep's one-line error: now every point's
    config is checked first (the trainer's own checks, train/config.py): one line naming the point, nothing run."""
    key, value = bad
    d = tmp_path_factory.mktemp("bad-axis")
    cfg = d / "cfg.yaml"
    cfg.write_text("data:\n  path: no-data-needed\n  tokenizer: none-needed\ntrain:\n  steps: 1\n")
    good = {"world": 1, "model.num_heads": 4}.get(key, _ok_value(key))
    grid = Grid(axes={key: [good, value] if before else [value]}, prefix="p")   # a valid point first, or not
    with pytest.raises(PretokError) as e:
        run_sweep(cfg, grid, d / "runs", module=FAKE, env=ENV, echo=None)
    msg = str(e.value)
    assert "\n" not in msg and key.rsplit(".", 1)[-1] in msg.replace("world size", "world"), msg
    assert not (d / "runs").exists() or not any((d / "runs").iterdir())


def _ok_value(key: str):
    from pretok_lib.train.config import Config, numbers

    return numbers(Config()).get(key, 1)


def test_cli_sweep_refuses_an_invalid_axis_before_running_and_in_a_dry_run(tmp_path: Path, config: Path,
                                                                          capsys) -> None:
    runs = tmp_path / "runs"
    for extra in ([], ["--dry-run"]):
        args = ["sweep", "--config", str(config), "--axis", "seq_len=64,0", "--runs-dir", str(runs), "--module", FAKE]
        assert cli_main(args + extra) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "sweep point sweep-w1-s0: data.seq_len must be >= 1 (got 0)" in err, err
        assert not runs.exists()
    assert cli_main(["sweep", "--config", str(config), "--axis", "world=two", "--dry-run"]) == 1
    assert "world size must be a whole number >= 1 (got 'two')" in capsys.readouterr().err


@given(usable=st.integers(1, 256), worlds=st.lists(st.integers(1, 16), min_size=1, max_size=5))
def test_sweep_threads_are_one_count_that_fits_the_largest_world(usable: int, worlds: list[int]) -> None:
    t = sweep_threads([Point(w, ()) for w in worlds], usable)
    assert t >= 1 and (t * max(worlds) <= usable or t == 1)


def test_each_local_run_is_probed_and_a_cpu_hog_flags_it(tmp_path: Path, config: Path) -> None:
    """Issue 34: a machine probe around every sweep run, recorded in its launcher.json attempt; a CPU hog outside
    the sweep's process tree (started by the test) flags the run (the outside-CPU counter, never a speed), and the
    study's machine record names it."""
    from pretok_lib.analysis.runs import load_runs
    from pretok_lib.study.measured import run_machine

    from ..machine.test_probe import _HOG

    runs = tmp_path / "runs"
    pid = int(subprocess.run([sys.executable, "-c", _HOG], capture_output=True, text=True, check=True,
                             timeout=60).stdout)
    try:
        res = run_sweep(config, expand_grid({}, {"data": ["padded"]}), runs, module=FAKE,
                        env={**ENV, "FAKE_SLEEP_S": "1.5"}, echo=None, calibrate=False)
    finally:
        os.kill(pid, signal.SIGKILL)
    assert [s for _, s in res] == ["completed"]
    probe = json.loads((runs / res[0][0].run_id / "launcher.json").read_text())["attempts"][-1]["probe"]
    assert probe["run"] == res[0][0].run_id and probe["outside_cpu_cores"] > 0.5, probe
    assert probe["quiet"] is False and any("outside the study" in r for r in probe["reasons"])
    mach = run_machine(load_runs(runs))
    assert mach["quiet"] is False and mach["probed_runs"] == 1 and mach["flagged"][0]["run"] == res[0][0].run_id
