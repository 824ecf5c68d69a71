"""`pretok export` / a completed run's <run>/hf: a transformers model directory that reproduces the run.

The exported model's loss on the validation batches equals the run's last val_loss; it generates; a 2-rank DDP
run exports the same weights as the 1-rank run of the same global batch; the tokenizer round-trips through
AutoTokenizer; bad run directories are one line and leave nothing behind.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load as load_bytes
from safetensors.torch import load_file

from pretok_lib.data import make_dataset, make_loader
from pretok_lib.train.loop import forward_loss_sum
from pretok_lib.train.run import RUN_LOCK

from ..conftest import GPT2_JSON, ROOT, WIKI_EN, needs_root, one_line, tiny_memmap
from .conftest import SEQ, records, run_cli, run_here, tiny_overrides

EVAL = {"eval.every": 3, "eval.batches": 2, "train.steps": 3}


@pytest.fixture(scope="module")
def runs(train_data, tmp_path_factory) -> Path:
    """`one`: 1 rank, micro_batch 8; `two`: 2 gloo ranks, micro_batch 4 (the same global batch); both export."""
    base = tmp_path_factory.mktemp("export-runs")
    overrides = tiny_overrides(train_data, base, **{"eval.path": train_data.val, "checkpoint.export": True, **EVAL})
    run_here(overrides + ["run.id=one", "data.micro_batch=8"])
    run_cli(overrides + ["run.id=two", "data.micro_batch=4"], nproc=2)
    return base


def cli(*args: str, check: bool = False) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    p = subprocess.run([sys.executable, "-m", "pretok_lib.cli", "export", *args], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    if check and p.returncode:
        raise AssertionError(p.stderr[-3000:])
    return p


def export(capsys, *args: str) -> tuple[int, str, str]:
    """`pretok export ARGS` in this process (cli.main, the error boundary): (exit code, stdout, stderr)."""
    from pretok_lib.cli import main

    capsys.readouterr()
    rc = main(["export", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def load(directory: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(directory)).eval()


def val_loss(model, val: Path, micro_batch: int, world: int, batches: int) -> float:
    """The trainer's evaluate(): the first `batches` micro-batches of every rank's shard, summed per rank, on one
    thread like the run's ranks (run_cli: OMP_NUM_THREADS=1)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _val_loss(model, val, micro_batch, world, batches)
    finally:
        torch.set_num_threads(threads)


def _val_loss(model, val: Path, micro_batch: int, world: int, batches: int) -> float:
    total = torch.zeros(2, dtype=torch.float64)
    for rank in range(world):
        part = torch.zeros(2, dtype=torch.float64)
        ds = make_dataset("pretok-memmap", val, SEQ, micro_batch=micro_batch, rank=rank, world=world, seed=0,
                          shuffle=False)
        for i, batch in enumerate(make_loader(ds)):
            if i >= batches:
                break
            with torch.no_grad():
                part[0] += forward_loss_sum(model, batch, torch.device("cpu"), "fp32").item()
            part[1] += batch["effective_tokens"]
        total += part
    return float(total[0] / total[1])


def test_a_completed_run_exports_itself_and_records_it(runs):
    for name in ("one", "two"):
        out = runs / name / "hf"
        assert {p.name for p in out.iterdir()} >= {"config.json", "model.safetensors", "tokenizer.json",
                                                    "tokenizer_config.json", "pretok_export.json"}
        info = json.loads((runs / name / "run.json").read_text())
        assert info["status"] == "completed" and info["export"]["path"] == "hf" and info["export"]["step"] == 3
        assert info["export"]["tokenizer"]["exported"] and info["export"]["tokenizer"]["kind"] == "hf-json"
        assert info["tokenizer"]["fingerprint"] == info["export"]["tokenizer"]["fingerprint"]
        assert not [p for p in (runs / name).iterdir() if p.name.startswith(".") and p.name != RUN_LOCK]  # no temps


@pytest.mark.parametrize("name,micro_batch,world", [("one", 8, 1), ("two", 4, 2)])
def test_exported_model_reproduces_the_last_validation_loss(runs, train_data, name, micro_batch, world):
    last = records(runs / name, "val")[-1]
    assert last["step"] == 3
    model = load(runs / name / "hf")
    assert next(model.parameters()).dtype == torch.float32
    got = val_loss(model, train_data.val, micro_batch, world, EVAL["eval.batches"])
    assert got == last["val_loss"]       # bit-exact: the same weights, batches, kernels and summation order


def test_exported_model_generates(runs):
    from transformers import AutoTokenizer

    tok, model = AutoTokenizer.from_pretrained(str(runs / "one" / "hf")), load(runs / "one" / "hf")
    ids = tok("The history of", return_tensors="pt")["input_ids"]
    out = model.generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    assert out.shape == (1, ids.shape[1] + 8) and torch.equal(out[0, :ids.shape[1]], ids[0])
    assert isinstance(tok.decode(out[0, ids.shape[1]:]), str)
    assert model.generation_config.eos_token_id == tok.eos_token_id == 50256     # GPT-2 <|endoftext|>


def test_two_rank_export_equals_one_rank_export(runs):
    one, two = (load_file(runs / name / "hf" / "model.safetensors") for name in ("one", "two"))
    assert one.keys() == two.keys() and len(one) > 10
    for key in one:
        assert one[key].dtype == two[key].dtype == torch.float32 and one[key].shape == two[key].shape
        torch.testing.assert_close(two[key], one[key], rtol=1e-5, atol=1e-6, msg=key)
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (runs / "one" / "hf" / name).read_bytes() == (runs / "two" / "hf" / name).read_bytes(), name


def test_export_command_writes_the_checkpoint_weights_exactly(runs, tmp_path, capsys):
    p = cli(str(runs / "one"), "--out", str(tmp_path / "x"), check=True)
    assert "step 3 of one exported, model and tokenizer" in p.stdout
    got = load_file(tmp_path / "x" / "model.safetensors")
    ckpt = torch.load(runs / "one" / "checkpoints" / "step_00000003" / "model.pt", weights_only=True)
    assert got.keys() == ckpt.keys()
    assert all(torch.equal(got[k], ckpt[k]) for k in ckpt)
    assert json.loads((runs / "one" / "run.json").read_text())["export"]["path"] == str((tmp_path / "x").resolve())
    assert export(capsys, str(runs / "one"), "--out", str(tmp_path / "x"))[0] == 0   # a previous export: replaced
    assert not [q for q in tmp_path.iterdir() if q.name.startswith(".")]


def test_autotokenizer_round_trips_text_with_the_gpt2_ids(runs):
    from transformers import AutoTokenizer

    from pretok_lib.tokenizer import load_tokenizer, make_encoder, probe_texts

    tok = AutoTokenizer.from_pretrained(str(runs / "one" / "hf"))
    ref = make_encoder(load_tokenizer(GPT2_JSON), "hf-tokenizers")
    texts = [v["extract"] for v in list(json.loads(WIKI_EN.read_text()).values())[:50]] + probe_texts(["<|endoftext|>"])
    for text in texts:
        ids = tok(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        want, _ = ref.encode_batch([text])
        assert ids == want.tolist()
        assert tok.decode(ids) == text


def _copy_run(runs: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(runs / "one", run, ignore=shutil.ignore_patterns("hf"))
    return run


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


BAD = {
    "missing": (lambda run: shutil.rmtree(run), "no such run directory"),
    "not a run": (lambda run: (run / "config.yaml").unlink(), "not a training run directory"),
    "no checkpoint": (lambda run: shutil.rmtree(run / "checkpoints"), "no checkpoint to export"),
    "flipped byte": (lambda run: _flip(run / "checkpoints" / "step_00000003" / "model.pt"),
                     "damaged checkpoint: model.pt does not match its checksum"),
    "truncated": (lambda run: os.truncate(run / "checkpoints" / "step_00000003" / "model.pt", 100),
                  "damaged checkpoint: model.pt does not match its checksum"),
    "checksums gone": (lambda run: (run / "checkpoints" / "step_00000003" / "checksums.json").write_text("{"),
                       "damaged checkpoint: checksums.json unreadable"),
    "wrong model": (lambda run: (run / "config.yaml").write_text(
        (run / "config.yaml").read_text().replace("num_layers: 2", "num_layers: 3")),
        "model.pt does not hold this run's model"),
    "bad config": (lambda run: (run / "config.yaml").write_text("model: {hidden_size: -1}\n"),
                   "model.hidden_size must be >= 1"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_run_dir_is_one_line_and_writes_nothing(case, runs, tmp_path, capsys):
    run = _copy_run(runs, tmp_path)
    damage, expected = BAD[case]
    damage(run)
    out = tmp_path / "out"
    rc, stdout, stderr = export(capsys, str(run), "--out", str(out))
    assert rc == 1 and stdout == ""
    one_line(stderr, expected)
    assert not out.exists() and {q.name for q in tmp_path.iterdir()} <= {"run"}


def test_step_option_names_a_missing_checkpoint(runs, tmp_path, capsys):
    rc, _, stderr = export(capsys, str(_copy_run(runs, tmp_path)), "--step", "2", "--out", str(tmp_path / "o"))
    assert rc == 1 and "no checkpoint of step 2" in stderr and len(stderr.strip().splitlines()) == 1


def test_a_tokenizer_that_cannot_be_found_is_a_warning_and_the_model_is_still_exported(runs, tmp_path, capsys):
    run = _copy_run(runs, tmp_path)
    info = json.loads((run / "run.json").read_text())
    info["tokenizer"]["spec"] = str(tmp_path / "gone" / "tokenizer.json")
    (run / "run.json").write_text(json.dumps(info))
    rc, stdout, stderr = export(capsys, str(run))
    warning = [line for line in stderr.splitlines() if line.startswith("warning:")]
    assert rc == 0 and len(warning) == 1 and "without a tokenizer" in warning[0], stderr
    assert "gone/tokenizer.json: no such tokenizer file" in warning[0]
    assert "model only (no tokenizer)" in stdout
    assert not (run / "hf" / "tokenizer.json").exists() and load(run / "hf").config.vocab_size == 50304
    assert json.loads((run / "run.json").read_text())["export"]["tokenizer"]["exported"] is False


def test_an_existing_directory_that_is_no_export_is_refused(runs, tmp_path, capsys):
    run = _copy_run(runs, tmp_path)
    (tmp_path / "keep").mkdir()
    (tmp_path / "keep" / "mine.txt").write_text("x")
    rc, _, stderr = export(capsys, str(run), "--out", str(tmp_path / "keep"))
    assert rc == 1 and "is not a pretok export" in stderr
    assert (tmp_path / "keep" / "mine.txt").read_text() == "x"


@pytest.fixture(scope="module")
def small_run(tmp_path_factory) -> Path:
    """A run on a 512-token tokenizer: its export (~0.7 MB) fits a small tmpfs."""
    base = tmp_path_factory.mktemp("small-run")
    memmap, tok = tiny_memmap(base)
    args = ["run.id=s", f"data.path={memmap}", f"data.seq_len={SEQ}", "data.micro_batch=4", "train.steps=2",
            "train.precision=fp32", "model.hidden_size=64", "log.tensorboard=false", "checkpoint.every=0"]
    (base / "args.txt").write_text("\n".join(args))
    run_here([f"run.dir={base}", *args])
    return base / "s"


@needs_root
def test_a_full_disk_keeps_the_previous_export_and_leaves_no_temp(small_run, tmp_path, capsys):
    size = sum(p.stat().st_size for p in (small_run / "hf").iterdir())
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size * 3 // 2}", "tmpfs", str(mnt)], check=True)
    try:
        assert export(capsys, str(small_run), "--out", str(mnt / "hf"))[0] == 0
        before = {p.name: p.read_bytes() for p in (mnt / "hf").iterdir()}
        rc, _, stderr = export(capsys, str(small_run), "--out", str(mnt / "hf"))
        assert rc == 1, stderr
        one_line(stderr, "No space left on device")
        assert {p.name: p.read_bytes() for p in (mnt / "hf").iterdir()} == before
        assert [q.name for q in mnt.iterdir()] == ["hf"]
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _pages(path: Path) -> int:
    return sum(-(-p.stat().st_size // 4096) for p in path.rglob("*") if p.is_file())


@needs_root
def test_a_full_disk_during_the_end_of_run_export_fails_the_run_and_a_rerun_exports(small_run, tmp_path, capsys):
    """Room for the run but not its export: exit 1 naming the file, run.json failed, no partial export; with
    room again the same command resumes at the last step and exports."""
    from pretok_lib.cli import main

    args = (small_run.parent / "args.txt").read_text().split("\n")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    run_pages = _pages(small_run) - _pages(small_run / "hf")
    size = (run_pages + _pages(small_run / "hf") // 2 + 2) * 4096
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], check=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)                 # as small_run was trained (run_here): the same weights
    try:
        capsys.readouterr()
        assert main(["train", *args, f"run.dir={mnt}"]) == 1
        err = capsys.readouterr().err
        errors = [line for line in err.splitlines() if "error:" in line]
        assert len(errors) == 1 and "No space left on device" in errors[0] and "Traceback" not in err, err
        info = json.loads((mnt / "s" / "run.json").read_text())
        assert info["status"] == "failed" and "No space left on device" in info["error"]
        assert not (mnt / "s" / "hf").exists()
        assert not [p for p in (mnt / "s").iterdir() if p.name.startswith(".") and p.name != RUN_LOCK]
        subprocess.run(["mount", "-o", "remount,size=64m", str(mnt)], check=True)
        assert main(["train", *args, f"run.dir={mnt}"]) == 0
        info = json.loads((mnt / "s" / "run.json").read_text())
        assert info["status"] == "completed" and info["export"]["step"] == 2
        want = load_file(small_run / "hf" / "model.safetensors")
        got = load_bytes((mnt / "s" / "hf" / "model.safetensors").read_bytes())     # not mmapped: the tmpfs unmounts
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    finally:
        torch.set_num_threads(threads)
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.parametrize("swap", [True, False], ids=["renameat2-exchange", "two-renames"])
def test_replacing_a_previous_export_leaves_only_the_new_one(swap, tmp_path, monkeypatch):
    from pretok_lib.train import export as ex

    if not swap:
        monkeypatch.setattr(ex, "_exchange", lambda a, b: False)
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "old.txt").write_text("old")
    (tmp_path / ".tmp-hf-1").mkdir()
    (tmp_path / ".tmp-hf-1" / "new.txt").write_text("new")
    ex._replace(tmp_path / ".tmp-hf-1", tmp_path / "hf")
    assert [p.name for p in tmp_path.iterdir()] == ["hf"]
    assert [p.name for p in (tmp_path / "hf").iterdir()] == ["new.txt"]
    ex._replace(tmp_path / "hf", tmp_path / "fresh")             # no previous one
    assert [p.name for p in tmp_path.iterdir()] == ["fresh"]


@pytest.mark.parametrize("source", ["config", "manifest"])
def test_a_run_from_before_run_json_named_its_tokenizer_finds_it(source, runs, tmp_path, capsys):
    """Older run.json has no `tokenizer`: the config's data.tokenizer, else the pretokenized data's manifest."""
    import yaml

    run = _copy_run(runs, tmp_path)
    info = json.loads((run / "run.json").read_text())
    del info["tokenizer"]
    (run / "run.json").write_text(json.dumps(info))
    if source == "manifest":
        cfg = yaml.safe_load((run / "config.yaml").read_text())
        cfg["data"]["tokenizer"] = None
        (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    rc, stdout, stderr = export(capsys, str(run))
    assert rc == 0 and "model and tokenizer" in stdout and "warning" not in stderr, stderr
    assert (run / "hf" / "tokenizer.json").read_bytes() == (runs / "one" / "hf" / "tokenizer.json").read_bytes()


@pytest.mark.parametrize("where", [".", "..", "checkpoints", "checkpoints/step_00000008", "checkpoints/new", "./x/.."])
def test_an_out_that_would_replace_the_run_is_refused_even_with_overwrite(where, runs, tmp_path, capsys):
    """`pretok export runs/x --out runs/x --overwrite` replaced the whole run (checkpoints, metrics, config) with
    its export and exited 0; its parent or its checkpoints likewise: refused, nothing touched."""
    run = _copy_run(runs, tmp_path)
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    rc, _, stderr = export(capsys, str(run), "--out", str(run / where), "--overwrite")
    assert rc == 1 and "would replace the run's own files" in stderr and stderr.count("\n") == 1, stderr
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before
