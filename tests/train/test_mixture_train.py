"""Training on a weighted mixture (docs/MIXTURES.md): per-dataset tokens in metrics.jsonl follow the blend exactly;
2 gloo ranks see what 1 rank sees; an elastic resume mid-mixture continues the stream; resuming on another
mixture, mixing tokenizers and bad mixture configs are refused with one line (exit 2)."""

from __future__ import annotations

import json
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pretok_lib.cli import main as cli_main
from pretok_lib.data.blend import Blend
from pretok_lib.errors import PretokError
from pretok_lib.pretokenize import TokenizeConfig, run_tokenize
from pretok_lib.train.config import load_config

from ..conftest import CL100K_JSON, GPT2_JSON, WIKI_FR
from .conftest import SEQ, records, run_cli, run_here, tiny_overrides

WEIGHTS = (0.25, 0.75)


@pytest.fixture(scope="module")
def second(tmp_path_factory, shared_data):
    """French summaries pretokenized with GPT-2 (mixes with the English training data) and with cl100k (does not)."""
    base = tmp_path_factory.mktemp("fr")
    docs = [v["extract"] for v in json.loads(WIKI_FR.read_text()).values()][:150]
    pq.write_table(pa.table({"text": docs}), base / "fr.parquet")
    for name, tok in (("gpt2", GPT2_JSON), ("cl100k", CL100K_JSON)):
        run_tokenize(TokenizeConfig(inputs=[str(base / "fr.parquet")], out=str(base / name), tokenizer=str(tok),
                                    format="memmap", workers=0, progress=False))
    return base


def _mix(train_data, second, weights=WEIGHTS, fr="gpt2") -> str:
    en = train_data.dirs["pretok-memmap"]
    return f"data.mixture=[{{path: '{en}', weight: {weights[0]}}}, {{path: '{second / fr}', weight: {weights[1]}}}]"


def _overrides(train_data, second, runs, **extra) -> list[str]:
    o = [x for x in tiny_overrides(train_data, runs, **extra) if not x.startswith("data.path=")]
    return o + [_mix(train_data, second)]


def test_two_ranks_and_an_elastic_resume_see_the_one_rank_mixture(train_data, second, tmp_path, capsys):
    base = _overrides(train_data, second, tmp_path, **{"train.steps": 4, "checkpoint.every": 2})
    run_here(base + ["run.id=one", "data.micro_batch=8"])
    run_cli(base + ["run.id=two", "data.micro_batch=4"], nproc=2)
    one, two = records(tmp_path / "one"), records(tmp_path / "two")
    blend = Blend(WEIGHTS)
    for r in one:  # the realised mixture is the blend's, exactly: samples × seq_len tokens per dataset
        assert r["cum_source_tokens"] == [c * SEQ for c in blend.counts(r["samples"])]
        assert sum(r["cum_source_tokens"]) == r["cum_tokens"]
        assert sum(r["cum_source_effective_tokens"]) == r["cum_effective_tokens"]
    keys = ("samples", "source_tokens", "source_effective_tokens", "cum_source_tokens", "effective_tokens")
    assert [[r[k] for k in keys] for r in two] == [[r[k] for k in keys] for r in one]
    assert [r["loss"] for r in two] == pytest.approx([r["loss"] for r in one], rel=1e-4)
    # the 2-rank run as if preempted after step 2, resumed by 1 rank: the same stream, the same counters
    el = tmp_path / "elastic"
    shutil.copytree(tmp_path / "two" / "checkpoints" / "step_00000002", el / "checkpoints" / "step_00000002")
    shutil.copy(tmp_path / "two" / "metrics.jsonl", el / "metrics.jsonl")
    run_here(base + ["run.id=elastic", "data.micro_batch=8"])
    assert "resumed from" in capsys.readouterr().err
    assert [[r[k] for k in keys] for r in records(el)] == [[r[k] for k in keys] for r in one]
    assert [r["loss"] for r in records(el)] == pytest.approx([r["loss"] for r in one], rel=1e-4)
    # resuming that checkpoint on another mixture is refused: one line, exit 2
    other = tmp_path / "other"
    shutil.copytree(tmp_path / "two" / "checkpoints" / "step_00000002", other / "checkpoints" / "step_00000002")
    o = [x for x in base if not x.startswith("data.mixture=")] + [_mix(train_data, second, (0.5, 0.5))]
    rc = cli_main(["train", *o, "run.id=other"])  # in this process: `pretok train`'s exit status and error line
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert rc == 2 and "another data order (differs in: mixture)" in err
    assert json.loads((other / "run.json").read_text())["status"] == "failed"


def test_mixing_tokenizers_is_refused_naming_the_manifest(train_data, second, tmp_path, capsys):
    o = [x for x in _overrides(train_data, second, tmp_path) if not x.startswith("data.mixture=")]
    rc = cli_main(["train", *o, _mix(train_data, second, fr="cl100k")])  # in this process, as `pretok train`
    stderr = capsys.readouterr().err
    err = [line for line in stderr.splitlines() if "error" in line]
    assert rc == 2 and len(err) == 1 and "Traceback" not in stderr
    assert f"{second / 'cl100k'}/manifest.json: was tokenized with" in err[0]


@pytest.mark.parametrize("overrides, problem", [
    (["data.path=x", "data.mixture=[{path: a, weight: 1}]"], "give data.path or data.mixture, not both"),
    (["data.mixture=[{path: a}]"], "data.mixture[0].weight is missing"),
    (["data.mixture=[{path: a, weight: 0}]"], "data.mixture[0].weight must be"),
    (["data.mixture=[{path: a, weight: .nan}]"], "data.mixture[0].weight must be"),
    (["data.mixture=[{path: a, weight: 1, kind: x}]"], "unknown config key 'data.mixture[0].kind'"),
    (["data.mixture=[{weight: 1}]"], "data.mixture[0].path is empty"),
    (["data.mixture={path: a}"], "data.mixture: expected a list"),
    (["data.mixture=[{path: a, weight: 1}]", "data.mixture_exhausted=never"], "is not epoch or stop"),
    (["data.mixture=[{path: a, weight: 1}]", "data.kind=padded", "data.tokenizer=t"], "tokenizes on the fly"),
])
def test_bad_mixture_config_is_one_line_exit_2(overrides, problem, tmp_path, capsys):
    rc = cli_main(["train", f"run.dir={tmp_path}", *overrides])
    err = capsys.readouterr().err
    assert rc == 2 and problem in err and len(err.strip().splitlines()) == 1
    assert not any(tmp_path.iterdir())


def test_mixture_config_round_trips(tmp_path):
    cfg = load_config(None, ["data.mixture=[{path: a, weight: 3}, {path: b, weight: 0.5}]",
                             "data.mixture_exhausted=stop"])
    assert [(e.path, e.weight) for e in cfg.data.mixture] == [("a", 3.0), ("b", 0.5)]
    from pretok_lib.train.config import save_config

    save_config(cfg, tmp_path / "c.yaml")
    again = load_config(tmp_path / "c.yaml")
    assert again.data.mixture == cfg.data.mixture and again.data.mixture_exhausted == "stop"


def test_a_mixture_override_replaces_the_files_data_path(tmp_path):
    """`pretok train --config tiny.yaml data.mixture=[...]`: the command line's mixture replaces the file's
    data.path (and a data.path override the file's mixture); both on the command line stay an error."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("data:\n  path: runs/demo/memmap\n")
    c = load_config(cfg, ["data.mixture=[{path: a, weight: 1}]"])
    assert c.data.path == "" and [e.path for e in c.data.mixture] == ["a"]
    cfg.write_text("data:\n  mixture: [{path: a, weight: 1}]\n")
    c = load_config(cfg, ["data.path=b"])
    assert c.data.path == "b" and c.data.mixture == []
    cfg.write_text("data:\n  path: b\n  mixture: [{path: a, weight: 1}]\n")
    with pytest.raises(PretokError, match="not both"):
        load_config(cfg)
