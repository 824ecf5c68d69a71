"""Every kind of project tokenizer saved for transformers: AutoTokenizer (offline) gives the reference's ids."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from pretok_lib.errors import PretokError
from pretok_lib.tokenizer import backends_for, load_tokenizer, make_encoder
from pretok_lib.train import hf_tokenizer

from ..conftest import CL100K_TIKTOKEN, GPT2_JSON, MISTRAL_SP, R50K_TIKTOKEN, TEKKEN, WIKI_EN, WIKI_FR


def _hf_auto_dir(directory: Path) -> Path:
    """A transformers directory without tokenizer.json (kind hf-auto): GPT-2's vocab.json + merges.txt."""
    directory.mkdir()
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(GPT2_JSON.parent / name, directory / name)
    (directory / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "GPT2Tokenizer"}))
    return directory


@pytest.mark.parametrize("spec", [GPT2_JSON, R50K_TIKTOKEN, CL100K_TIKTOKEN, MISTRAL_SP, TEKKEN, "hf-auto"],
                         ids=lambda p: getattr(p, "name", p))
def test_autotokenizer_loads_every_kind_with_the_reference_ids(spec, tmp_path, shared_data):
    from transformers import AutoTokenizer

    info = load_tokenizer(_hf_auto_dir(tmp_path / "auto") if spec == "hf-auto" else spec)
    kinds = {GPT2_JSON: "hf-json", R50K_TIKTOKEN: "tiktoken", CL100K_TIKTOKEN: "tiktoken",
             MISTRAL_SP: "sentencepiece", TEKKEN: "tekken", "hf-auto": "hf-auto"}
    assert info.kind == kinds[spec]
    out = tmp_path / "out"
    out.mkdir()
    hf_tokenizer.save(info, out)
    tok = AutoTokenizer.from_pretrained(str(out))
    ref = make_encoder(info, backends_for(info)[-1])
    texts = [v["extract"] for w in (WIKI_EN, WIKI_FR) for v in list(json.loads(w.read_text()).values())[:20]]
    got = tok(texts, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    ids, offsets = ref.encode_batch(texts)
    assert got == [ids[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:])]
    assert [tok.decode(g) for g in got[:5]] == [ref.decode(g) for g in got[:5]]
    assert tok.convert_tokens_to_ids(tok.eos_token) == info.eos_id


def test_tiktoken_bounded_possessive_repeats_are_atomic_groups():
    """fancy-regex reads `\\p{N}{1,3}+` as possessive; Oniguruma (tokenizers) as `(\\p{N}{1,3})+`: digits in
    one run. cl100k splits "12345678" as 123|456|78 only with the rewrite."""
    assert hf_tokenizer._oniguruma(r"x|\p{N}{1,3}+|\s++$|[^\s]{2}+") == r"x|(?>\p{N}{1,3})|\s++$|(?>[^\s]{2})"
    assert [m.group() for m in re.finditer(r"\d{1,3}", "12345678")] == ["123", "456", "78"]


def test_a_tokenizer_transformers_cannot_reproduce_is_one_line(tmp_path, monkeypatch):
    info = load_tokenizer(GPT2_JSON)
    monkeypatch.setattr(hf_tokenizer, "mismatch", lambda tok, info: "ids differ on probe 'x'")
    with pytest.raises(PretokError, match=r"gives other ids than hf-tokenizers: ids differ on probe") as e:
        hf_tokenizer.save(info, tmp_path)
    assert str(GPT2_JSON) in str(e.value) and "\n" not in str(e.value)
