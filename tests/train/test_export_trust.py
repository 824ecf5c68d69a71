"""`pretok export` exports a tokenizer only when a record proves it is the run's (run.json's fingerprint, else the
checkpoint's record of the data it read), and `--out ... --overwrite` replaces only an earlier export.

Fault injection: run.json removed, the training data re-tokenized with another tokenizer under the run; --out
directories holding generated mixes of an export's files and others."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pretok_lib.errors import PretokError
from pretok_lib.pretokenize import TokenizeConfig, run_tokenize
from pretok_lib.train.export import RECORD, refuse_foreign_files

from ..conftest import CL100K_JSON, one_line
from .conftest import run_here, tiny_overrides
from .test_export import export


@pytest.fixture(scope="module")
def trained(train_data, tmp_path_factory):
    """A run on one dataset (`single`) and on a mixture (`mix`) of private copies of the training data (`ds`,
    `ds2`), so a test may re-tokenize them; `pristine`: copies to restore."""
    base = tmp_path_factory.mktemp("export-trust")
    for name, src in (("ds", train_data.dirs["pretok-memmap"]), ("ds2", train_data.val)):
        shutil.copytree(src, base / name)
        shutil.copytree(src, base / "pristine" / name)
    o = [x for x in tiny_overrides(train_data, base / "runs", **{"train.steps": 2, "data.path": base / "ds"})
         if not x.startswith("data.tokenizer=")]
    run_here(o + ["run.id=single"])
    mix = f"data.mixture=[{{path: '{base / 'ds'}', weight: 1}}, {{path: '{base / 'ds2'}', weight: 1}}]"
    run_here([x for x in o if not x.startswith("data.path=")] + [mix, "run.id=mix"])
    return base


def _retokenize(base: Path, name: str, train_data) -> None:
    shutil.rmtree(base / name)
    run_tokenize(TokenizeConfig(inputs=[str(train_data.text.parent / "val.parquet")], out=str(base / name),
                                tokenizer=str(CL100K_JSON), format="memmap", workers=0, progress=False))


CASES = {  # run, what is done to it, whether the tokenizer is still proven the run's
    "mixture, run.json gone": ("mix", [], True),
    "mixture, run.json gone, a dataset re-tokenized": ("mix", ["ds2"], False),
    "one dataset, run.json gone": ("single", [], True),
    "one dataset, run.json gone, re-tokenized": ("single", ["ds"], False),
}


@pytest.mark.parametrize("case", CASES)
def test_a_tokenizer_not_proven_the_runs_is_refused(case, trained, train_data, tmp_path, capsys):
    """A mixture run without run.json exported the tokenizer of whatever manifest its empty data.path found, and a
    run on data re-tokenized since exported the new tokenizer beside the old model: exit 0, no warning."""
    name, retokenize, proven = CASES[case]
    run = tmp_path / name
    shutil.copytree(trained / "runs" / name, run, ignore=shutil.ignore_patterns("hf"))
    (run / "run.json").unlink()
    try:
        for ds in retokenize:
            _retokenize(trained, ds, train_data)
        rc, stdout, stderr = export(capsys, str(run), "--out", str(tmp_path / "hf"))
    finally:
        for ds in retokenize:
            shutil.rmtree(trained / ds)
            shutil.copytree(trained / "pristine" / ds, trained / ds)
    if proven:
        assert rc == 0 and "warning" not in stderr, stderr
        record = json.loads((tmp_path / "hf" / RECORD).read_text())["tokenizer"]
        manifest = json.loads((trained / "ds" / "manifest.json").read_text())["tokenizer"]
        assert record["exported"] and record["fingerprint"] == manifest["fingerprint"]
    else:
        assert rc == 1 and stdout == "", stderr
        one_line(stderr, "cannot be proven to be the run's", prefix=f"pretok: error: {run}: ")
        assert not (tmp_path / "hf").exists() and not list(tmp_path.glob(".tmp-*"))


EXPORT_NAMES = ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                "tokenizer_config.json", "special_tokens_map.json", "model-00001-of-00002.safetensors",
                "model.safetensors.index.json"]
FOREIGN = ["notes.txt", "train.parquet", "model.pt", "config.yaml", "data.bin", "README.md"]


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.sets(st.sampled_from(EXPORT_NAMES)), st.sets(st.sampled_from(FOREIGN), max_size=2), st.booleans(),
       st.booleans(), st.sampled_from(["file", "dir"]))
def test_out_is_replaced_only_when_it_holds_nothing_but_an_export(tmp_path_factory, names, foreign, record,
                                                                  overwrite, kind):
    out = tmp_path_factory.mktemp("out") / "hf"
    out.mkdir()
    for n in names | ({RECORD} if record else set()):
        (out / n).write_text("x")
    for n in foreign:
        (out / n).mkdir() if kind == "dir" else (out / n).write_text("mine")
    before = sorted(p.name for p in out.iterdir())
    allowed = not foreign and (overwrite or record or not before)
    try:
        refuse_foreign_files(out, overwrite)
        assert allowed, (before, overwrite)
    except PretokError as e:
        assert not allowed and "\n" not in str(e) and str(e).startswith(f"{out}: exists and is not a pretok export")
        if foreign:
            assert "even with --overwrite" in str(e) and sorted(foreign)[0] in str(e)
    assert sorted(p.name for p in out.iterdir()) == before
    dir_with_export_name = tmp_path_factory.mktemp("out") / "hf"
    (dir_with_export_name / "config.json").mkdir(parents=True)  # a directory named like an export's file
    with pytest.raises(PretokError, match="even with --overwrite"):
        refuse_foreign_files(dir_with_export_name, True)


def test_overwrite_keeps_a_directory_holding_other_files_beside_an_export(trained, tmp_path, capsys):
    """`--out DIR --overwrite` swapped DIR whole for the new export: the user's files in it were deleted."""
    out = tmp_path / "mine"
    rc, _, stderr = export(capsys, str(trained / "runs" / "single"), "--out", str(out))
    assert rc == 0, stderr
    (out / "notes.txt").write_text("mine")
    rc, _, stderr = export(capsys, str(trained / "runs" / "single"), "--out", str(out), "--overwrite")
    assert rc == 1 and "notes.txt" in stderr and "even with --overwrite" in stderr, stderr
    assert (out / "notes.txt").read_text() == "mine" and (out / RECORD).is_file()
    (out / "notes.txt").unlink()
    rc, _, stderr = export(capsys, str(trained / "runs" / "single"), "--out", str(out))   # an earlier export
    assert rc == 0, stderr
