"""BOS/EOS/PAD found wherever tokenizers keep them (pretok_lib/tokenizer/specials.py): generated tokenizer.json files
declaring each role in any of the places (tokenizer_config.json as a string or an AddedToken dict,
special_tokens_map.json, a TemplateProcessing post-processor plain or inside a Sequence, special added tokens under
DeepSeek's U+FF5C/U+2581 names, well-known strings), the real tokenizers of ../shared/data, and a DeepSeek-V3-like
tokenizer.json through `pretok tokenize --bos yes --eos yes`."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pretok_lib.cli import main
from pretok_lib.formats.manifest import read_manifest
from pretok_lib.formats.memmap import MemmapDataset
from pretok_lib.tokenizer import load_tokenizer
from pretok_lib.tokenizer.specials import KNOWN, role_name

from ..conftest import CL100K_JSON, CL100K_TIKTOKEN, GPT2_JSON, MISTRAL_SP, R50K_TIKTOKEN, TEKKEN

DEEPSEEK = ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>")
DECOYS = ("<｜fim▁hole｜>", "<｜place▁holder▁no▁7｜>", "<|im_start|>", "<think>", "<｜tool▁calls▁begin｜>", "<unk>",
          "<|fim_pad|>", "<mask>")
SPELLINGS = {  # how tokenizers spell each role
    "bos": (DEEPSEEK[0], "<s>", "<|begin_of_text|>", "<bos>", "[BOS]", "<|startoftext|>", "<｜begin of sentence｜>"),
    "eos": (DEEPSEEK[1], "</s>", "<|end_of_text|>", "<eos>", "<|endoftext|>", "[EOS]", "<｜end-of-sentence｜>"),
    "pad": (DEEPSEEK[2], "<pad>", "[PAD]", "<|pad|>", "<padding>"),
}
ROLES = ("bos", "eos", "pad")


def tiny_bpe(path: Path, specials: tuple[str, ...] = ("<s>", "</s>"), post_processor=None) -> Path:
    """A byte-level BPE without merges (one token per byte of ASCII text) whose first ids are `specials`, each a
    special added token (as DeepSeek-V3's tokenizer.json holds them); written to `path`."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {s: i for i, s in enumerate(specials)}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab.setdefault(ch, len(vocab))
    tok = Tokenizer(models.BPE(vocab, []))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    if post_processor is not None:
        tok.post_processor = post_processor
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path


def deepseek_like(path: Path, with_post_processor: bool = True) -> Path:
    """DeepSeek-V3's special tokens (ids 0, 1, 2 under U+FF5C/U+2581 names, then decoys), and, like its file, a
    Sequence post-processor (ByteLevel, then a TemplateProcessing putting BOS first)."""
    from tokenizers import processors

    pp = processors.Sequence([processors.ByteLevel(trim_offsets=False), processors.TemplateProcessing(
        single=f"{DEEPSEEK[0]} $A", pair=f"{DEEPSEEK[0]} $A {DEEPSEEK[0]} $B",
        special_tokens=[(DEEPSEEK[0], 0)])]) if with_post_processor else None
    return tiny_bpe(path, DEEPSEEK + DECOYS, pp)


def test_role_names_strip_decoration():
    assert [role_name(s) for s in DEEPSEEK] == ["begin_of_sentence", "end_of_sentence", "pad"]
    assert [role_name(s) for s in ("<|endoftext|>", "</s>", "[PAD]", "<｜end-of-sentence｜>")] == [
        "endoftext", "/s", "pad", "end_of_sentence"]
    assert not any(role_name(d) in ("bos", "eos", "pad", "s", "/s") for d in DECOYS)


@pytest.mark.parametrize("with_post_processor", [True, False])
def test_deepseek_v3_special_tokens_are_bos_eos_pad(tmp_path, with_post_processor):
    """DeepSeek-V3's tokenizer.json (no tokenizer_config.json beside it) gave bos=None eos=None: its special tokens
    are no well-known strings and its TemplateProcessing sits inside a Sequence post-processor."""
    info = load_tokenizer(deepseek_like(tmp_path / "tokenizer.json", with_post_processor))
    assert (info.bos_id, info.eos_id, info.pad_id) == (0, 1, 2)
    assert info.special_sources == {"bos": "post_processor" if with_post_processor else "added_tokens",
                                    "eos": "added_tokens", "pad": "added_tokens"}


def test_deepseek_v3_tokenize_bos_yes_eos_yes(tmp_path, capsys):
    """`pretok tokenize --bos yes --eos yes` with a DeepSeek-V3-like tokenizer.json: it failed "defines no BOS
    token"; now every document is [0] + ids + [1], and the manifest says where each id came from."""
    tok = deepseek_like(tmp_path / "ds" / "tokenizer.json")
    docs = ["Hello world", "second doc", "x"]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    out = tmp_path / "out"
    rc = main(["tokenize", str(tmp_path / "in.jsonl"), "--out", str(out), "--tokenizer", str(tok), "--format",
               "memmap", "--bos", "yes", "--eos", "yes", "--workers", "0", "--no-progress"])
    assert rc == 0, capsys.readouterr().err
    assert "no separator" not in capsys.readouterr().err
    m = read_manifest(out)
    assert (m["policy"]["bos_id"], m["policy"]["eos_id"]) == (0, 1)
    assert m["tokenizer"]["special_sources"] == {"bos": "post_processor", "eos": "added_tokens", "pad": "added_tokens"}
    assert m["boundaries"] == {"separator": "bos+eos"}
    ds = MemmapDataset(out / "data")
    for i, d in enumerate(docs):
        ids = np.asarray(ds[i]).tolist()
        assert ids[0] == 0 and ids[-1] == 1 and len(ids) == len(d) + 2


# ---------------------------------------------------------------- generated tokenizer.json files

WHERE = st.fixed_dictionaries({
    "config": st.sampled_from([None, "str", "dict", "null", "map", "map+config", "other"]),
    "post": st.sampled_from([None, "plain", "sequence"]),
    "special": st.booleans(),  # its added token is marked special (else an added token that is not special)
})


@st.composite
def declared(draw):
    """Per role: a spelling, an id, where it is declared; decoys at other ids."""
    roles = {r: {"name": draw(st.sampled_from(SPELLINGS[r])), **draw(WHERE)} for r in ROLES}
    decoys = draw(st.lists(st.sampled_from(DECOYS), unique=True, max_size=4))
    names = [roles[r]["name"] for r in ROLES] + decoys
    ids = draw(st.permutations(range(len(names))))
    for r, i in zip(ROLES, ids):
        roles[r]["id"] = i
    return roles, dict(zip(decoys, ids[3:]))


def _write(directory: Path, roles: dict, decoys: dict) -> None:
    """tokenizer.json (+ tokenizer_config.json / special_tokens_map.json) declaring `roles` as drawn."""
    from tokenizers import pre_tokenizers

    tokens = {r["name"]: r["id"] for r in roles.values()} | decoys
    vocab = dict(tokens)
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab.setdefault(ch, len(vocab))
    special = {r["name"]: r["special"] for r in roles.values()}
    added = [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": special.get(s, True)} for s, i in sorted(tokens.items(), key=lambda t: t[1])]
    single, specials = [{"Sequence": {"id": "A", "type_id": 0}}], {}
    for r, where in (("bos", 0), ("eos", len(single) + 1)):
        if roles[r]["post"]:
            name = roles[r]["name"]
            single.insert(where, {"SpecialToken": {"id": name, "type_id": 0}})
            specials[name] = {"id": name, "ids": [roles[r]["id"]], "tokens": [name]}
    template = {"type": "TemplateProcessing", "single": single, "pair": single, "special_tokens": specials}
    post = template if specials else None
    if specials and any(roles[r]["post"] == "sequence" for r in ("bos", "eos")):
        post = {"type": "Sequence", "processors": [{"type": "ByteLevel", "add_prefix_space": True,
                                                    "trim_offsets": False, "use_regex": True}, template]}
    obj = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
           "post_processor": post, "decoder": {"type": "ByteLevel"},
           "model": {"type": "BPE", "vocab": vocab, "merges": []}}
    (directory / "tokenizer.json").write_text(json.dumps(obj, ensure_ascii=False), encoding="utf-8")
    configs: dict[str, dict] = {}
    other = next(iter(decoys), None)
    for r, d in roles.items():
        how, value = d["config"], d["name"]
        if how is None:
            continue
        entry = {"str": value, "dict": {"content": value, "special": True}, "null": None, "other": other,
                 "map": value, "map+config": value}[how]
        if how.startswith("map"):
            configs.setdefault("special_tokens_map.json", {})[f"{r}_token"] = other if how == "map+config" else value
        if how != "map":
            configs.setdefault("tokenizer_config.json", {})[f"{r}_token"] = entry
    for name, cfg in configs.items():
        (directory / name).write_text(json.dumps(cfg, ensure_ascii=False), encoding="utf-8")


def _expected(role: str, roles: dict, decoys: dict) -> tuple[int | None, str | None]:
    """The documented order: tokenizer_config.json, special_tokens_map.json, the post-processor, special added
    tokens named for the role, well-known strings."""
    d = roles[role]
    tokens = {r["name"]: r["id"] for r in roles.values()} | decoys
    how = d["config"]
    if how in ("str", "dict", "map+config"):
        return d["id"], "tokenizer_config.json"
    if how == "null":
        return None, "tokenizer_config.json"
    if how == "other":
        return (tokens[next(iter(decoys))] if decoys else None), "tokenizer_config.json"
    if how == "map":
        return d["id"], "special_tokens_map.json"
    if d["post"] and role in ("bos", "eos"):
        return d["id"], "post_processor"
    if d["special"] and d["name"] in SPELLINGS[role]:
        return d["id"], "added_tokens"
    for s in KNOWN[role]:  # the spec's list of well-known strings
        if s in tokens:
            return tokens[s], "well-known string"
    return None, None


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=declared())
def test_generated_tokenizers_resolve_in_the_documented_order(tmp_path_factory, case):
    """Whatever names, ids and places a tokenizer.json and its configs declare BOS/EOS/PAD in, each role is the
    first declaration in the documented order, and `special_sources` names it."""
    roles, decoys = case
    d = tmp_path_factory.mktemp("tok")
    _write(d, roles, decoys)
    info = load_tokenizer(d)
    want = {r: _expected(r, roles, decoys) for r in ROLES}
    got = {r: (getattr(info, f"{r}_id"), info.special_sources[r]) for r in ROLES}
    assert got == want, (roles, decoys)
    assert replace(load_tokenizer(d / "tokenizer.json"), spec=info.spec) == info  # the file or its directory


# ---------------------------------------------------------------- the real tokenizers

REAL = {  # (bos, eos, pad) and where each was found
    "gpt2": (GPT2_JSON, (50256, 50256, None), ("well-known string", "added_tokens", None)),
    "cl100k": (CL100K_JSON, (100257, 100257, None), ("well-known string", "added_tokens", None)),
    "r50k_tt": (R50K_TIKTOKEN, (50256, 50256, None), ("well-known string", "tiktoken special_tokens", None)),
    "cl100k_tt": (CL100K_TIKTOKEN, (100257, 100257, None), ("well-known string", "tiktoken special_tokens", None)),
    "mistral_sp": (MISTRAL_SP, (1, 2, None), ("sentencepiece model", "sentencepiece model", None)),
    "tekken": (TEKKEN, (1, 2, 11), ("tekken special_tokens",) * 3),
}


@pytest.mark.parametrize("name", REAL)
def test_real_tokenizers_say_where_their_special_ids_come_from(shared_data, name):
    path, ids, sources = REAL[name]
    info = load_tokenizer(path)
    assert (info.bos_id, info.eos_id, info.pad_id) == ids
    assert info.special_sources == dict(zip(ROLES, sources))


def test_a_config_beside_a_real_sentencepiece_model_wins(shared_data, tmp_path):
    """tokenizer_config.json beside a .model overrides the model's own ids (an AddedToken dict, an explicit null)."""
    (tmp_path / "tokenizer.model").write_bytes(MISTRAL_SP.read_bytes())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": None,
                                                                "eos_token": {"content": "<s>", "special": True}}))
    info = load_tokenizer(tmp_path / "tokenizer.model")
    assert (info.bos_id, info.eos_id, info.pad_id) == (None, 1, None)
    assert info.special_sources == {"bos": "tokenizer_config.json", "eos": "tokenizer_config.json", "pad": None}
