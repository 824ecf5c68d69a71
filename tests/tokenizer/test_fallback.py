"""A candidate backend that cannot be built (issue 14, class 3): the run falls back to the next exact candidate, the
same in every process and whatever the worker count, with the reason in the manifest; nothing buildable, a forced
backend that cannot be built or a corrupt tokenizer file: one clean error line naming the file."""

from __future__ import annotations

import base64
import json
import random
from pathlib import Path

import numpy as np
import pytest

from pretok_lib.errors import PretokError
from pretok_lib.pretokenize import TokenizeConfig, run_tokenize
from pretok_lib.tokenizer import _tiktoken_constants

from ..conftest import GPT2_JSON, PYDOCS_JSONL, R50K_TIKTOKEN, one_line
from ..engine.test_pretokenize import run_cli


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, shared_data) -> Path:
    """~100 KB of real documents (markup, code) as jsonl."""
    docs = [json.loads(line)["text"] for line in PYDOCS_JSONL.open()][:40]
    docs = [d for d in docs if len(d) < 20_000][:15]
    path = tmp_path_factory.mktemp("corpus") / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return path


def gapped_tiktoken(seed: int, directory: Path) -> Path:
    """r50k_base with a gap in its ranks at a seeded random place (never a single byte): a rank line deleted, or
    every rank from there on shifted up. tiktoken runs it; fastokens refuses to build it."""
    rng = random.Random(seed)
    lines = R50K_TIKTOKEN.read_bytes().splitlines()
    at = rng.randrange(256, len(lines) - 1)
    if rng.random() < 0.5:
        del lines[at]
    else:
        shift = rng.randint(1, 20_000)
        lines = lines[:at] + [b"%s %d" % (t, int(r) + shift) for t, r in map(bytes.split, lines[at:])]
    path = directory / f"seed{seed}" / "r50k_base.tiktoken"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def reference_ids(tokenizer_file: Path, corpus: Path) -> np.ndarray:
    """The corpus's ids from the tiktoken library itself, built on the gapped ranks."""
    import tiktoken

    pattern = _tiktoken_constants(R50K_TIKTOKEN)[0]
    ranks = {base64.b64decode(t): int(r) for t, r in map(bytes.split, tokenizer_file.read_bytes().splitlines())}
    enc = tiktoken.Encoding("gapped", pat_str=pattern, mergeable_ranks=ranks, special_tokens={})
    docs = [json.loads(line)["text"] for line in corpus.open()]
    return np.array([i for d in docs for i in enc.encode_ordinary(d)], np.int64)


def tokenize(corpus: Path, tokenizer_file: Path, out: Path, workers: int, backend: str | None = None) -> dict:
    return run_tokenize(TokenizeConfig(inputs=[str(corpus)], out=str(out), tokenizer=str(tokenizer_file),
                                       workers=workers, bos="no", eos="no", backend=backend, progress=False,
                                       part_mb=0.03))


def stored_ids(out: Path, manifest: dict) -> np.ndarray:
    return np.fromfile(out / "data.bin", manifest["policy"]["dtype"]).astype(np.int64)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("seed", range(3))
def test_gapped_ranks_fall_back_to_tiktoken(tmp_path, corpus, seed, workers):
    gapped = gapped_tiktoken(seed, tmp_path)
    m = tokenize(corpus, gapped, tmp_path / "out", workers)
    choice = m["tokenizer"]["backend"]
    assert choice["backend"] == "tiktoken" and list(choice["rejected"]) == ["fastokens"], choice
    assert choice["rejected"]["fastokens"].startswith("cannot be built: ValueError: model error:")
    np.testing.assert_array_equal(stored_ids(tmp_path / "out", m), reference_ids(gapped, corpus))


def test_fallback_output_is_the_same_for_any_worker_count(tmp_path, corpus):
    gapped = gapped_tiktoken(7, tmp_path)
    outs = [tmp_path / f"w{w}" for w in (0, 1, 2)]
    manifests = [tokenize(corpus, gapped, out, w) for out, w in zip(outs, (0, 1, 2))]
    assert len({(o / "data.bin").read_bytes() for o in outs}) == 1
    assert len({json.dumps(m["tokenizer"]["backend"], sort_keys=True) for m in manifests}) == 1


def test_hf_json_that_fastokens_refuses_falls_back_in_workers(tmp_path, corpus):
    """The zygote's early fastokens build of a tokenizer.json fails (a Whitespace pre-tokenizer): HF tokenizers
    runs, in the workers and inline alike."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(GPT2_JSON))
    from tokenizers import pre_tokenizers

    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    outs = []
    for w in (0, 2):
        m = tokenize(corpus, tmp_path / "tokenizer.json", tmp_path / f"w{w}", w)
        assert m["tokenizer"]["backend"]["backend"] == "hf-tokenizers"
        assert "Whitespace" in m["tokenizer"]["backend"]["rejected"]["fastokens"]
        outs.append((tmp_path / f"w{w}" / "data.bin").read_bytes())
    docs = [json.loads(line)["text"] for line in corpus.open()]
    want = [i for e in tok.encode_batch(docs, add_special_tokens=False) for i in e.ids]
    assert outs[0] == outs[1] and np.frombuffer(outs[0], np.uint16).tolist() == want


def one_error_line(args: list[str], *needles: str) -> str:
    r = run_cli(*args, timeout=120)
    assert r.returncode == 1, r.stderr
    return one_line(r.stderr, *needles)


@pytest.mark.parametrize("workers", ["0", "2"])
def test_forced_backend_that_cannot_be_built_is_one_line(tmp_path, corpus, workers):
    gapped = gapped_tiktoken(3, tmp_path)
    one_error_line(["tokenize", str(corpus), "--tokenizer", str(gapped), "--out", str(tmp_path / "o"),
                    "--workers", workers, "--backend", "fastokens"],
                   str(gapped), "backend 'fastokens' cannot be built", "non-contiguous")
    assert not (tmp_path / "o" / "manifest.json").exists()


def corrupt_tokenizers(directory: Path, seed: int) -> list[Path]:
    """Seeded corruptions: tokenizer.json cut at random places, .tiktoken files with one garbage line (random
    bytes, a missing or extra field, a bad rank, a duplicate token or rank) at a random place."""
    rng = random.Random(seed)
    out = []
    text = GPT2_JSON.read_bytes()
    for i in range(3):
        path = directory / f"cut{i}" / "tokenizer.json"
        path.parent.mkdir()
        path.write_bytes(text[:rng.randrange(1, len(text) - 1)])
        out.append(path)
    lines = R50K_TIKTOKEN.read_bytes().splitlines()
    token = lines[rng.randrange(len(lines))].split()[0]
    garbage = [bytes(rng.randrange(256) for _ in range(12)), b"not-base64! 5", token, token + b" 7 extra",
               token + b" -3", token + b" x", b"YWJj 12", lines[rng.randrange(256, len(lines))]]
    for i, bad in enumerate(garbage):
        at = rng.randrange(len(lines))
        path = directory / f"garbage{i}" / "r50k_base.tiktoken"
        path.parent.mkdir()
        path.write_bytes(b"\n".join(lines[:at] + [bad] + lines[at:]) + b"\n")
        out.append(path)
    return out


def test_corrupt_tokenizer_files_give_one_clean_line(tmp_path, corpus):
    for i, bad in enumerate(corrupt_tokenizers(tmp_path, seed=14)):
        one_error_line(["tokenize", str(corpus), "--tokenizer", str(bad), "--out", str(tmp_path / f"o{i}"),
                        "--workers", "2" if i % 4 == 0 else "0"], str(bad))
        assert not (tmp_path / f"o{i}" / "manifest.json").exists()


def test_unknown_forced_backend_is_one_line(tmp_path, corpus):
    one_error_line(["tokenize", str(corpus), "--tokenizer", str(GPT2_JSON), "--out", str(tmp_path / "o"),
                    "--workers", "2", "--backend", "tiktoken"], str(GPT2_JSON), "'tiktoken' is not available")


class Panic(BaseException):
    """Like pyo3's PanicException (a Rust panic in fastokens): not an Exception."""


def test_any_build_failure_falls_back_and_nothing_buildable_is_one_line(tmp_path, corpus, monkeypatch):
    from pretok_lib import tokenizer as tk

    real = tk._BUILDERS["hf-json"]

    def panicking(info, backend):
        if backend == "fastokens":
            raise Panic("called `Option::unwrap()` on a `None` value")
        return real(info, backend)

    monkeypatch.setitem(tk._BUILDERS, "hf-json", panicking)
    m = tokenize(corpus, GPT2_JSON, tmp_path / "a", 0)
    assert m["tokenizer"]["backend"]["backend"] == "hf-tokenizers"
    assert m["tokenizer"]["backend"]["rejected"] == {"fastokens": "cannot be built: Panic: called `Option::unwrap()` "
                                                                  "on a `None` value"}
    monkeypatch.setitem(tk._BUILDERS, "hf-json", lambda info, backend: {}[backend])
    with pytest.raises(PretokError, match="no tokenizer backend can be built from this file") as e:
        tokenize(corpus, GPT2_JSON, tmp_path / "b", 0)
    assert str(e.value).startswith(f"{GPT2_JSON}: ") and "fastokens: KeyError" in str(e.value)
    assert "\n" not in str(e.value) and not (tmp_path / "b" / "manifest.json").exists()
