"""The vocabulary size and special ids of a tokenizer.json, read from its JSON (no tokenizer built), equal what
the HF library reads from it: on the shared tokenizers and on generated ones of every model type."""

from __future__ import annotations

import json
import random

import pytest
import tokenizers
from tokenizers import models, pre_tokenizers, trainers

from pretok_lib.errors import PretokError
from pretok_lib.tokenizer import load_tokenizer
from pretok_lib.tokenizer.files import json_vocab

from ..conftest import CL100K_JSON, GPT2_JSON
from ..engine.test_pretokenize import run_cli

SPECIALS = ["<s>", "</s>", "<pad>", "<|endoftext|>", "<|begin_of_text|>", "[PAD]", "<eos>", "<bos>", "<x1>", "a"]
WORDS = "the of and to in is was for on as with by he at from his an were are which this be or had".split()


def _hf_view(text: str) -> tuple[dict[str, int], int]:
    tok = tokenizers.Tokenizer.from_str(text)
    vocab = tok.get_vocab(with_added_tokens=True)
    return vocab, max(vocab.values()) + 1


def _generated(seed: int) -> str:
    """A small trained tokenizer of a random model type with random added and special tokens, as JSON text."""
    rng = random.Random(seed)
    kind = rng.choice(["bpe", "wordpiece", "wordlevel", "unigram"])
    specials = rng.sample(SPECIALS, rng.randint(0, 5))
    model, trainer = {
        "bpe": (models.BPE(unk_token=None), trainers.BpeTrainer),
        "wordpiece": (models.WordPiece(unk_token="[UNK]"), trainers.WordPieceTrainer),
        "wordlevel": (models.WordLevel(unk_token="[UNK]"), trainers.WordLevelTrainer),
        "unigram": (models.Unigram(), trainers.UnigramTrainer),
    }[kind]
    tok = tokenizers.Tokenizer(model)
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    unk = ["[UNK]"] if kind in ("wordpiece", "wordlevel") else []
    text = [" ".join(rng.choices(WORDS, k=30)) for _ in range(50)]
    tok.train_from_iterator(text, trainer(special_tokens=unk + specials, vocab_size=rng.randint(40, 200)))
    tok.add_tokens(rng.sample(WORDS + ["zzz", "new token", "the"], rng.randint(0, 4)))  # some already in the vocab
    tok.add_special_tokens(rng.sample(SPECIALS, rng.randint(0, 3)))
    return tok.to_str()


@pytest.mark.parametrize("seed", range(24))
def test_generated_tokenizers_read_as_the_hf_library_reads_them(tmp_path, seed):
    text = _generated(seed)
    want_vocab, want_size = _hf_view(text)
    assert json_vocab(json.loads(text), tmp_path) == want_vocab
    path = tmp_path / "tokenizer.json"
    path.write_text(text)
    info = load_tokenizer(path)
    assert info.vocab_size == want_size
    for role in ("bos", "eos", "pad"):  # an id found by a special string is that string's id in the library
        got = getattr(info, f"{role}_id")
        assert got is None or got in want_vocab.values()


@pytest.mark.parametrize("path", [GPT2_JSON, CL100K_JSON], ids=["gpt2", "cl100k"])
def test_shared_tokenizers(shared_data, path):
    text = path.read_text()
    want_vocab, want_size = _hf_view(text)
    info = load_tokenizer(path)
    assert info.vocab_size == want_size
    tok = tokenizers.Tokenizer.from_str(text)
    assert info.eos_id == tok.token_to_id("<|endoftext|>") and info.bos_id == info.eos_id


@pytest.mark.parametrize("damage,why", [
    (lambda o: o["model"].pop("vocab"), "model.vocab is missing"),
    (lambda o: o.pop("model"), "neither a HF tokenizer.json"),
    (lambda o: o.update(model=[]), "model.vocab is missing"),
    (lambda o: o["model"].update(vocab={"a": "zero"}), "not a non-negative integer"),
    (lambda o: o["model"].update(vocab={"a": -1}), "not a non-negative integer"),
    (lambda o: o.update(added_tokens=[{"content": "x"}]), "KeyError"),
    (lambda o: o["model"].update(vocab=[[1, 0.0]]), "not a string"),
])
def test_damaged_vocabularies_are_one_line_errors(tmp_path, damage, why):
    obj = json.loads(_generated(3))
    damage(obj)
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(obj))
    with pytest.raises(PretokError, match=why) as e:
        load_tokenizer(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_empty_vocabulary(tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps({"model": {"type": "WordLevel", "vocab": {}}, "added_tokens": []}))
    with pytest.raises(PretokError, match="empty vocabulary"):
        load_tokenizer(path)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("damage", [
    lambda o: o.update(pre_tokenizer={"type": "NoSuchPreTokenizer"}),
    lambda o: o.update(normalizer={"type": "NoSuchNormalizer"}),
    lambda o: o["model"].update(type="NoSuchModel"),
    lambda o: o.update(decoder={"type": "ByteLevel", "add_prefix_space": "maybe"}),
], ids=["pre_tokenizer", "normalizer", "model", "decoder"])
def test_a_tokenizer_no_backend_builds_fails_in_one_line_before_the_output_exists(tmp_path, damage, workers):
    """Its vocabulary reads (so loading it succeeds), its build fails in every backend: one line, and no output
    directory that a rerun with a fixed tokenizer would refuse as another config's."""
    obj = json.loads(_generated(5))
    damage(obj)
    bad = tmp_path / "tokenizer.json"
    bad.write_text(json.dumps(obj))
    corpus = tmp_path / "c.txt"
    corpus.write_text("the of and to in\n" * 50)
    out = tmp_path / "out"
    r = run_cli("tokenize", str(corpus), "--tokenizer", str(bad), "--out", str(out), "--workers", str(workers))
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1, r.stderr
    assert str(bad) in lines[0] and "no tokenizer backend can be built" in lines[0]
    assert not out.exists() or not any(out.iterdir())
