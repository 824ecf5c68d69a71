"""`pretok gpu-study` end to end on this CPU with tiny sizes (the command that ran issue 39 on an H200): every part
fills its section of the one JSON, the stall checks pair each path run with the loader benchmark's row (back to back
and paced), the engine's curve is fitted; a budget that no part fits skips them and says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ..conftest import GPT2_JSON, ROOT, WIKI_EN

TINY = ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.num_kv_heads=1",
        "model.intermediate_size=64", "data.seq_len=64", "data.micro_batch=2"]


def gpu_study(tmp_path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", PRETOK_PYTHON=sys.executable)
    return subprocess.run([str(ROOT / "scripts" / "gpu_study.sh"), "--workdir", str(tmp_path / "w"),
                           "--json", str(tmp_path / "out" / "gpu-study.json"), *args],
                          capture_output=True, text=True, env=env, timeout=600)


@pytest.mark.slow
def test_every_part_on_a_cpu(tmp_path, shared_data):
    docs = [v["extract"] for v in json.loads(WIKI_EN.read_text()).values()][:400]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    p = gpu_study(tmp_path, "--corpus", str(corpus), "--tokenizer", str(GPT2_JSON), "--set", *TINY,
                  "--mfu-steps", "4", "--mfu-skip", "1", "--no-compile", "--path-steps", "4", "--path-skip", "1",
                  "--paths", "padding-free", "--loader-batches", "5", "--loader-slow-batches", "3",
                  "--loader-repeats", "2", "--paced-batches", "2", "--engine-mb", "1", "--engine-workers", "1,2",
                  "--engine-repeats", "1", "--budget", "900")
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    out = json.loads((tmp_path / "out" / "gpu-study.json").read_text())
    assert out["errors"] == {} and out["skipped"] == {} and out["finished"]
    assert set(out["parts"]) == {"data", "mfu", "paths", "loaders", "engine"}
    # pretokenized for what runs only: the mfu part's memmap (the one path asked for tokenizes on the fly)
    assert [p.name for p in (tmp_path / "w").glob("pretok-s*/*")] == ["memmap"]
    mfu = out["parts"]["mfu"]
    assert mfu["measured_steps"] == 2 and 0 < mfu["mfu"]["median"] <= 1   # steps 2-3: the 4th is profiled
    assert mfu["profile"]["timed_on"] == "cpu" and mfu["profile"]["busy_s"] > 0
    assert mfu["facts"]["precision"] in ("fp32", "bf16") and mfu["met"] == (mfu["mfu"]["median"] >= 0.4)
    runs = out["parts"]["paths"]["runs"]
    assert sorted(runs) == ["padding-free w0", "padding-free w2"]   # on the fly: the corpus tokenized in the loader
    checks = out["parts"]["loaders"]["checks"]
    for name, c in checks.items():
        for model in ("back_to_back", "paced"):
            v = c[model]
            lo, hi = v["interval"]
            assert 0 <= lo <= v["predicted_stall"] <= hi <= 1
            assert v["inside"] == (lo <= v["measured_stall"] <= hi)
            assert v["measured_stall"] == pytest.approx(runs[name]["data_stall"], rel=0.05, abs=1e-4)
        either = c["either"]   # from the lower of the two models' ends to the higher
        assert either["interval"] == [min(c[m]["interval"][0] for m in ("back_to_back", "paced")),
                                      max(c[m]["interval"][1] for m in ("back_to_back", "paced"))]
        assert either["inside"] == (either["interval"][0] <= either["measured_stall"] <= either["interval"][1])
        for v in (either, c["back_to_back"], c["paced"]):   # the measured stall's interval over the run's steps
            mlo, mhi = v["measured_interval"]
            assert mlo <= v["measured_stall"] <= mhi
            assert v["agrees"] == (mlo <= v["interval"][1] and v["interval"][0] <= mhi) and v["agrees"] >= v["inside"]
    rates = json.loads((tmp_path / "w" / "loaders.json").read_text())["loaders"]
    assert rates["padding-free w0"]["paced_batches"] == 2 and rates["padding-free w0"]["paced_batch_s"] > 0
    assert sorted(k for k in rates if not k.startswith("ref:")) == ["padding-free w0", "padding-free w2"]
    curve = out["parts"]["engine"]["curve"]
    assert [r["workers"] for r in curve["rows"]] == [1, 2]
    assert curve["rows"][1]["w1_from"] == "other runs"          # w2's run skipped w1: the N = 1 run's is used
    assert curve["fits"]["amdahl"]["sigma"] >= 0
    assert out["environment"]["cpus"] >= 1 and "torch" in out["environment"]


def test_a_budget_no_part_fits_skips_them_and_says_so(tmp_path):
    p = gpu_study(tmp_path, "--parts", "engine", "--budget", "1")
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads((tmp_path / "out" / "gpu-study.json").read_text())
    assert out["parts"] == {} and "budget" in out["skipped"]["engine"] and out["finished"]


@pytest.mark.parametrize("args, word", [(["--parts", "mfu,gpu"], "gpu"), (["--paths", "memmap"], "memmap")])
def test_an_unknown_part_or_path_is_one_line(tmp_path, args, word):
    p = gpu_study(tmp_path, *args)
    assert p.returncode != 0 and word in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_a_training_run_past_its_time_is_stopped_with_its_process_tree(tmp_path):
    """The parts hand each training run what is left of the budget (`run_path(timeout=...)`): past it the run's
    whole process tree is stopped, so a hung run cannot eat the parts after it."""
    import psutil

    from pretok_lib.bench.train import TrainBench, run_path

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(subprocess.TimeoutExpired):   # the child is still importing torch after 0.3 s
        run_path("pretok-memmap", str(tmp_path / "data"), str(GPT2_JSON), TrainBench(), tmp_path / "runs",
                 timeout=0.3)
    assert {p.pid for p in psutil.Process().children(recursive=True)} == before


def test_the_pack_for_a_gpu_machine_holds_the_corpus_and_tokenizers(tmp_path, shared_data):
    import tarfile

    out = tmp_path / "data.tar.gz"
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_study_pack.py"), "--out", str(out)],
                       capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["documents"] == 20485 and not list(tmp_path.glob("*.tmp"))
    with tarfile.open(out) as tar:
        assert sorted(tar.getnames()) == ["corpus.jsonl", "gpt2/tokenizer.json", "tekken_240718.json"]
        lines = tar.extractfile("corpus.jsonl").read().decode().splitlines()
    assert len(lines) == 20485 and all(json.loads(x)["text"].strip() for x in lines)
