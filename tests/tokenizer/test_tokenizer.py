"""Tokenizer loading, fingerprints, backend selection and exact-id equivalence on real tokenizers and corpora."""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import re

import numpy as np
import pytest

from pretok_lib import tokenizer as tk
from pretok_lib.errors import PretokError
from pretok_lib.tokenizer import (BackendChoice, TokenizerInfo, backends_for, id_dtype_for, load_tokenizer,
                                  make_encoder, select_backend)

from ..conftest import (CL100K_JSON, CL100K_TIKTOKEN, GPT2_JSON, MISTRAL_SP, PYDOCS_JSONL, R50K_TIKTOKEN, TEKKEN,
                       TOKENIZERS, WIKI_FR, WIKITEXT_VALID, needs_root)

SPECS = {"gpt2": GPT2_JSON, "cl100k": CL100K_JSON, "r50k_tt": R50K_TIKTOKEN, "cl100k_tt": CL100K_TIKTOKEN,
         "mistral_sp": MISTRAL_SP, "tekken": TEKKEN}
# "Hello world" from ../shared/data/README.md: no BOS and no leading space in any convention (all checked below
# with every backend; SentencePiece adds its dummy prefix "▁Hello" itself, which is part of the id 23325).
HELLO = {"gpt2": [15496, 995], "cl100k": [9906, 1917], "r50k_tt": [15496, 995], "cl100k_tt": [9906, 1917],
         "mistral_sp": [23325, 2294], "tekken": [22177, 4304]}
EXPECTED = {  # kind, vocab_size, bos, eos, pad, id dtype
    "gpt2": ("hf-json", 50257, 50256, 50256, None, "uint16"),
    "cl100k": ("hf-json", 100277, 100257, 100257, None, "int32"),
    "r50k_tt": ("tiktoken", 50257, 50256, 50256, None, "uint16"),
    "cl100k_tt": ("tiktoken", 100277, 100257, 100257, None, "int32"),
    "mistral_sp": ("sentencepiece", 32768, 1, 2, None, "uint16"),
    "tekken": ("tekken", 131072, 1, 2, 11, "int32"),
}


@pytest.fixture(scope="module")
def infos(shared_data) -> dict[str, TokenizerInfo]:
    return {name: load_tokenizer(path) for name, path in SPECS.items()}


@pytest.fixture(scope="module")
def encoders(infos) -> dict[tuple[str, str], tk.Encoder]:
    return {(name, b): make_encoder(info, b) for name, info in infos.items() for b in backends_for(info)}


def _wikitext_articles(limit: int) -> list[str]:
    lines = WIKITEXT_VALID.read_text(encoding="utf-8").split("\n")
    starts = [i for i, line in enumerate(lines) if re.match(r"^ = [^=].* = $", line)]
    return ["\n".join(lines[a:b]) for a, b in zip(starts, starts[1:] + [len(lines)])][:limit]


@pytest.fixture(scope="module")
def english_docs(shared_data) -> list[str]:
    """~0.5 MB of python-docs (markup, code) and ~0.35 MB of wikitext (literal <unk>, @-@)."""
    with PYDOCS_JSONL.open(encoding="utf-8") as f:
        pydocs = [json.loads(line)["text"] for line in f][:60]
    docs = [d for d in pydocs if len(d) < 40_000][:30] + _wikitext_articles(20)
    assert sum(map(len, docs)) > 300_000 and any("<unk>" in d for d in docs)
    return docs


@pytest.fixture(scope="module")
def french_docs(shared_data) -> list[str]:
    obj = json.loads(WIKI_FR.read_text(encoding="utf-8"))
    return [v["extract"] for v in list(obj.values())[:1500] if v.get("extract")]


def _split(ids: np.ndarray, offsets: np.ndarray) -> list[list[int]]:
    return [ids[offsets[i]:offsets[i + 1]].tolist() for i in range(len(offsets) - 1)]


@pytest.mark.parametrize("name", list(SPECS))
def test_kind_sizes_and_special_ids(infos, name):
    info = infos[name]
    kind, vocab, bos, eos, pad, dtype = EXPECTED[name]
    assert (info.kind, info.vocab_size, info.bos_id, info.eos_id, info.pad_id) == (kind, vocab, bos, eos, pad)
    assert id_dtype_for(info.vocab_size) == dtype
    assert info.spec == str(SPECS[name])
    assert TokenizerInfo(**info.to_dict()) == info


@pytest.mark.parametrize("name", list(SPECS))
def test_hello_world_every_backend(infos, encoders, name):
    for backend in backends_for(infos[name]):
        enc = encoders[(name, backend)]
        ids, offsets = enc.encode_batch(["Hello world"])
        assert ids.tolist() == HELLO[name], backend
        assert enc.decode(ids) == "Hello world"


def test_tekken_special_ids_match_tekkenizer(infos, encoders):
    tek = encoders[("tekken", "mistral-common")]
    assert backends_for(infos["tekken"])[-1] == "mistral-common"
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    ref = Tekkenizer.from_file(TEKKEN)
    assert (infos["tekken"].bos_id, infos["tekken"].eos_id, infos["tekken"].pad_id) == (ref.bos_id, ref.eos_id, ref.pad_id)
    assert ref.n_words == infos["tekken"].vocab_size
    assert tek.decode([ref.bos_id, 22177, 4304, ref.eos_id]) == "<s>Hello world</s>"


def test_id_dtype_for():
    assert id_dtype_for(256) == "uint16" and id_dtype_for(65536) == "uint16"
    assert id_dtype_for(65537) == "int32" and id_dtype_for(131072) == "int32"
    with pytest.raises(PretokError):
        id_dtype_for(0)


def test_directory_with_tokenizer_json(tmp_path, infos):
    (tmp_path / "tokenizer.json").symlink_to(GPT2_JSON)
    info = load_tokenizer(tmp_path)
    assert info.kind == "hf-json" and info.fingerprint == infos["gpt2"].fingerprint
    assert make_encoder(info, "fastokens").encode_batch(["Hello world"])[0].tolist() == HELLO["gpt2"]


def test_directory_config_overrides_special_ids(tmp_path):
    (tmp_path / "tokenizer.json").symlink_to(GPT2_JSON)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": None, "eos_token": {"content": "<|endoftext|>"}, "pad_token": "!"}))
    info = load_tokenizer(tmp_path)
    assert (info.bos_id, info.eos_id, info.pad_id) == (None, 50256, 0)


def test_directory_with_sentencepiece_model(tmp_path, infos):
    (tmp_path / "tokenizer.model").symlink_to(MISTRAL_SP)
    info = load_tokenizer(tmp_path)
    assert info.kind == "sentencepiece" and info.fingerprint == infos["mistral_sp"].fingerprint


def test_hf_auto_directory_without_tokenizer_json(tmp_path, infos, english_docs):
    """transformers' AutoTokenizer on vocab.json + merges.txt; its reference is transformers itself."""
    for name in ("vocab.json", "merges.txt"):
        (tmp_path / name).symlink_to(TOKENIZERS / "gpt2" / name)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "GPT2Tokenizer", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}))
    info = load_tokenizer(tmp_path)
    assert (info.kind, info.vocab_size, info.bos_id, info.eos_id) == ("hf-auto", 50257, 50256, 50256)
    assert backends_for(info) == ["fastokens", "hf-tokenizers", "transformers"]
    choice = select_backend(info, english_docs[:5])
    assert (choice.backend, choice.reference, choice.rejected) == ("fastokens", "transformers", {})
    ids, offsets = make_encoder(info, "fastokens").encode_batch(english_docs[:5])
    ref = make_encoder(load_tokenizer(GPT2_JSON), "hf-tokenizers").encode_batch(english_docs[:5])
    assert np.array_equal(ids, ref[0]) and np.array_equal(offsets, ref[1])


def test_hub_name_offline_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(PretokError, match="not a local path and the hub is offline"):
        load_tokenizer("pretok-test-org/no-such-model")


@pytest.mark.parametrize("name", ["gpt2", "cl100k"])
def test_select_backend_picks_fastokens_with_identical_ids(infos, english_docs, name):
    info = infos[name]
    choice = select_backend(info, english_docs)
    assert isinstance(choice, BackendChoice)
    assert (choice.backend, choice.reference, choice.rejected) == ("fastokens", "hf-tokenizers", {})
    assert choice.checked_docs > len(english_docs) and choice.checked_tokens > 100_000
    fast = make_encoder(info, "fastokens").encode_batch(english_docs)
    ref = make_encoder(info, "hf-tokenizers").encode_batch(english_docs)
    assert np.array_equal(fast[0], ref[0]) and np.array_equal(fast[1], ref[1])
    assert json.loads(json.dumps(choice.to_dict()))["backend"] == "fastokens"


def test_tekken_fast_paths_equal_mistral_common_on_french(infos, encoders, french_docs):
    info = infos["tekken"]
    assert backends_for(info) == ["fastokens", "tiktoken", "mistral-common"]
    choice = select_backend(info, french_docs)
    assert (choice.backend, choice.reference, choice.rejected) == ("fastokens", "mistral-common", {})
    assert select_backend(info, french_docs[:200], force="tiktoken").backend == "tiktoken"
    ref = encoders[("tekken", "mistral-common")].encode_batch(french_docs)
    for backend in ("fastokens", "tiktoken"):
        got = encoders[("tekken", backend)].encode_batch(french_docs)
        assert np.array_equal(got[0], ref[0]) and np.array_equal(got[1], ref[1]), backend
    assert ref[0].min() >= 1000 and ref[0].max() < info.vocab_size  # ordinary ranks sit above 1000 special ids
    assert encoders[("tekken", "fastokens")].decode(got[0][got[1][3]:got[1][4]]) == french_docs[3]


def test_sentencepiece_backend(infos, encoders, french_docs):
    info = infos["mistral_sp"]
    assert backends_for(info) == ["sentencepiece"]
    choice = select_backend(info, french_docs[:50])
    assert (choice.backend, choice.reference, choice.checked_docs) == ("sentencepiece", "sentencepiece", 0)
    ids, offsets = encoders[("mistral_sp", "sentencepiece")].encode_batch(french_docs[:50])
    assert len(offsets) == 51 and ids.max() < info.vocab_size and 1 not in ids.tolist()
    assert encoders[("mistral_sp", "sentencepiece")].decode(ids[offsets[0]:offsets[1]]) == french_docs[0]


def test_forced_backend_not_a_candidate_raises(infos):
    with pytest.raises(PretokError, match="not available"):
        select_backend(infos["mistral_sp"], ["x"], force="fastokens")
    with pytest.raises(PretokError, match="not available"):
        make_encoder(infos["gpt2"], "tiktoken")


def test_mismatching_candidate_is_rejected_and_forcing_it_raises(infos, monkeypatch):
    """The check must catch a fast backend that differs on one probe (here: digits)."""
    real = tk._BUILDERS["hf-json"]

    def broken(info, backend):
        enc = real(info, backend)
        if backend != "fastokens":
            return enc
        encode = enc._encode
        enc._encode = lambda texts: encode([t.replace("7", "8") for t in texts])
        return enc

    monkeypatch.setitem(tk._BUILDERS, "hf-json", broken)
    choice = select_backend(infos["gpt2"], ["no digits here"])
    assert choice.backend == "hf-tokenizers" and "ids differ on probe" in choice.rejected["fastokens"]
    with pytest.raises(PretokError, match="does not match hf-tokenizers"):
        select_backend(infos["gpt2"], ["no digits here"], force="fastokens")


def test_select_backend_uses_a_supplied_encoder(infos):
    """The engine hands in the guess's encode_batch run by a worker; its ids are the ones compared."""
    good = make_encoder(infos["gpt2"], "fastokens").encode_batch
    seen = []
    choice = select_backend(infos["gpt2"], ["a sample"], encoders={"fastokens": lambda ts: seen.append(ts) or good(ts)})
    assert choice.backend == "fastokens" and seen and seen[0][0] == "a sample"
    shifted = select_backend(infos["gpt2"], ["a sample"],
                             encoders={"fastokens": lambda ts: (good(ts)[0] + 1, good(ts)[1])})
    assert shifted.backend == "hf-tokenizers" and "ids differ on sample text 0" in shifted.rejected["fastokens"]


def test_fastokens_load_failure_falls_back_to_reference(tmp_path):
    """fastokens refuses Metaspace pre-tokenizers (SentencePiece-style tokenizer.json): a rejection, not a crash."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.BPE({"<unk>": 0, "▁": 1, "a": 2, "b": 3, "▁a": 4, "ab": 5},
                               [("▁", "a"), ("a", "b")], unk_token="<unk>"))
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
    tok.save(str(tmp_path / "tokenizer.json"))
    choice = select_backend(load_tokenizer(tmp_path), ["ab a b"])
    assert choice.backend == "hf-tokenizers" and "Metaspace" in choice.rejected["fastokens"]


@pytest.mark.parametrize("name,text,forbidden", [
    ("gpt2", "a<|endoftext|>b", {50256}), ("r50k_tt", "a<|endoftext|>b", {50256}),
    ("cl100k", "x<|endoftext|>y<|fim_prefix|><|endofprompt|>", set(range(100256, 100277))),
    ("cl100k_tt", "x<|endoftext|>y<|fim_prefix|><|endofprompt|>", set(range(100256, 100277))),
    ("mistral_sp", "<s>[INST] hi</s><unk>", set(range(0, 11))),
    ("tekken", "<s>[INST] hi</s><unk><pad><SPECIAL_999>", set(range(0, 1000))),
])
def test_special_strings_are_ordinary_text(infos, encoders, name, text, forbidden):
    for backend in backends_for(infos[name]):
        enc = encoders[(name, backend)]
        ids = enc.encode_batch([text])[0].tolist()
        assert ids and not forbidden & set(ids), backend
        assert enc.decode(ids) == text, backend


def test_r50k_tiktoken_equals_gpt2_json(encoders, english_docs):
    a = encoders[("r50k_tt", "tiktoken")].encode_batch(english_docs)
    b = encoders[("gpt2", "hf-tokenizers")].encode_batch(english_docs)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


def test_cl100k_tiktoken_equals_cl100k_json(encoders, english_docs):
    """Measured: identical here (the tokenizer.json carries its own HF-compatible regex); digits included."""
    docs = english_docs + ["1234567890 12,345.678 ١٢٣٤ 2024-01-01T00:00:00 " * 20]
    a = encoders[("cl100k_tt", "tiktoken")].encode_batch(docs)
    b = encoders[("cl100k", "hf-tokenizers")].encode_batch(docs)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


def test_tiktoken_picks_fastokens(infos, english_docs):
    for name in ("r50k_tt", "cl100k_tt"):
        choice = select_backend(infos[name], english_docs[:10])
        assert (choice.backend, choice.reference, choice.rejected) == ("fastokens", "tiktoken", {})


@pytest.mark.parametrize("name", list(SPECS))
def test_encode_batch_shapes_and_empties(encoders, infos, name):
    for backend in backends_for(infos[name]):
        enc = encoders[(name, backend)]
        ids, offsets = enc.encode_batch(["Hello world", "", "a b c"])
        assert ids.dtype == np.uint32 and offsets.dtype == np.int64, backend
        assert offsets.shape == (4,) and offsets[0] == 0 and offsets[-1] == len(ids)
        assert offsets[1] == offsets[2]  # the empty string gives zero tokens
        assert _split(ids, offsets)[0] == HELLO[name]
        ids, offsets = enc.encode_batch([])
        assert ids.shape == (0,) and offsets.tolist() == [0] and ids.dtype == np.uint32 and offsets.dtype == np.int64


def test_fingerprint_is_file_sha256_and_detects_one_byte(tmp_path, infos):
    for name, path in SPECS.items():
        assert infos[name].fingerprint == "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
    assert load_tokenizer(GPT2_JSON).fingerprint == infos["gpt2"].fingerprint
    data = GPT2_JSON.read_bytes()
    i = data.index(b"<|endoftext|>") + 11
    copy = tmp_path / "tokenizer.json"
    copy.write_bytes(data[:i] + b"T" + data[i + 1:])  # '<|endoftexT|>': still valid JSON, one byte changed
    changed = load_tokenizer(copy)
    assert changed.fingerprint != infos["gpt2"].fingerprint
    copy.write_bytes(data)
    assert load_tokenizer(copy).fingerprint == infos["gpt2"].fingerprint


def test_editing_the_file_after_loading_is_detected(tmp_path):
    copy = tmp_path / "r50k_base.tiktoken"
    copy.write_bytes(R50K_TIKTOKEN.read_bytes())
    info = load_tokenizer(copy)
    copy.write_bytes(copy.read_bytes() + b"\n")
    with pytest.raises(PretokError, match="changed since"):
        make_encoder(info, "tiktoken")


def test_errors_name_the_file(tmp_path):
    missing = tmp_path / "missing.json"
    with pytest.raises(PretokError, match="no such") as e:
        load_tokenizer(missing)
    assert str(missing) in str(e.value)
    truncated = tmp_path / "tokenizer.json"
    truncated.write_bytes(GPT2_JSON.read_bytes()[:100_000])
    with pytest.raises(PretokError, match="corrupt or truncated JSON") as e:
        load_tokenizer(truncated)
    assert str(truncated) in str(e.value) and "\n" not in str(e.value)
    unknown = tmp_path / "weights.bin"
    unknown.write_bytes(b"PK\x03\x04 not a tokenizer")
    with pytest.raises(PretokError, match="unknown tokenizer format"):
        load_tokenizer(unknown)
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(PretokError, match="no tokenizer in this directory"):
        load_tokenizer(tmp_path / "empty_dir")
    other = tmp_path / "my_bpe.tiktoken"
    other.write_bytes(R50K_TIKTOKEN.read_bytes())
    with pytest.raises(PretokError, match="unknown tiktoken encoding 'my_bpe'"):
        load_tokenizer(other)
    bad_sp = tmp_path / "tokenizer.model"
    bad_sp.write_bytes(MISTRAL_SP.read_bytes()[:1000])
    with pytest.raises(PretokError, match="SentencePiece"):
        load_tokenizer(bad_sp)


def _worker(info_dict: dict, backend: str, texts: list[str]) -> tuple[list[int], int, str]:
    tk.limit_threads_to_one_cpu(0)
    ids, _ = make_encoder(TokenizerInfo(**info_dict), backend).encode_batch(texts)
    return ids.tolist(), len(os.sched_getaffinity(0)), os.environ["RAYON_NUM_THREADS"]


def test_fresh_spawned_worker_rebuilds_encoder_pinned_to_one_cpu(infos, english_docs):
    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:
        ids, n_cpus, rayon = pool.apply(_worker, (infos["cl100k"].to_dict(), "fastokens", english_docs[:3]))
    assert (n_cpus, rayon) == (1, "1")
    assert ids == make_encoder(infos["cl100k"], "hf-tokenizers").encode_batch(english_docs[:3])[0].tolist()


def test_identify_gives_what_make_encoder_needs_without_building(infos, english_docs):
    """`identify` (used by the worker zygote to start building at once) gives each tokenizer's kind and
    fingerprint exactly as `load_tokenizer` does, and an encoder built from it encodes identically."""
    for name, path in SPECS.items():
        quick, full = tk.identify(path), infos[name]
        assert (quick.spec, quick.kind, quick.fingerprint) == (full.spec, full.kind, full.fingerprint), name
        backend = backends_for(full)[0]
        a = make_encoder(quick, backend).encode_batch(english_docs[:3])
        b = make_encoder(full, backend).encode_batch(english_docs[:3])
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]), name


def _non_utf8_dir(base, seed: int):
    """A directory whose name holds bytes that are not UTF-8 (seeded: lone continuation bytes, a lead byte cut
    short, latin-1 letters), as Python names it (surrogate escapes): a file system of another encoding."""
    import random

    rng = random.Random(seed)
    junk = bytes(rng.choice([rng.randrange(0x80, 0xC0), rng.randrange(0xE0, 0xF0), rng.choice(b"\xe9\xfc\xf1")])
                 for _ in range(rng.randint(1, 4)))
    path = os.path.join(os.fsencode(base), b"tok " + junk)
    os.mkdir(path)
    return os.fsdecode(path)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("name", ["r50k_tt", "cl100k_tt"])
def test_fastokens_builds_a_tiktoken_file_whose_path_is_not_utf8(tmp_path, monkeypatch, infos, english_docs, name,
                                                                 seed):
    """fastokens takes a Rust string path: it refused such a file and the run fell back to tiktoken (3-4x slower);
    it now builds from a cached copy of the fingerprinted bytes, with the reference's ids."""
    monkeypatch.setenv("PRETOK_CACHE_DIR", str(tmp_path / "cache"))
    directory = _non_utf8_dir(tmp_path, seed)
    copy = os.path.join(directory, SPECS[name].name)
    with open(copy, "wb") as f:
        f.write(SPECS[name].read_bytes())
    with pytest.raises(UnicodeEncodeError):
        copy.encode("utf-8")
    info = load_tokenizer(copy)
    got = make_encoder(info, "fastokens").encode_batch(english_docs[:5])
    want = make_encoder(info, "tiktoken").encode_batch(english_docs[:5])
    assert all(np.array_equal(a, b) for a, b in zip(got, want))
    assert select_backend(info, english_docs[:2]).backend == "fastokens"


@needs_root
def test_a_full_cache_dir_leaves_no_partial_copy(tmp_path, monkeypatch, infos):
    """A derived file (tekken's ranks) that does not fit: the build fails (the run falls back to the next candidate)
    and the partial copy is removed, not left filling the file system (TMPDIR: a small tmpfs)."""
    from ..engine.test_faults_tokenize import tmpfs

    for size in (64 << 10, 1 << 20):  # far too small, and short by a few MB
        with tmpfs(tmp_path / f"cache{size}", size) as cache:
            monkeypatch.setenv("PRETOK_CACHE_DIR", str(cache))
            with pytest.raises(tk.BackendUnavailable, match="No space left"):
                make_encoder(infos["tekken"], "fastokens")
            assert [p.name for p in cache.iterdir()] == []


def _code_point_texts(seed: int) -> list[str]:
    """Every code point of the categories regex engines' tables may class differently, and a seeded sample of all
    code points, each in contexts where its class decides the split (after a space, before a letter, digit or
    contraction, between newlines)."""
    import random
    import unicodedata

    from pretok_lib.tokenizer.select import _VOLATILE_CATEGORIES

    volatile = [c for c in range(0x40000) if not 0xD800 <= c < 0xE000
                and (unicodedata.category(chr(c)) in _VOLATILE_CATEGORIES or chr(c).isspace())]
    rng = random.Random(seed)
    sample = [c for c in (rng.randrange(0x110000) for _ in range(3000)) if not 0xD800 <= c < 0xE000]
    contexts = (" {}x", "{} x", "x{}1", " {}1", "{}'ll", "\n{}\n", " {} ", "A{}a")
    return ["".join(ctx.format(chr(c)) for ctx in contexts) for c in volatile + sample]


@pytest.mark.parametrize("name", ["gpt2", "cl100k", "r50k_tt", "cl100k_tt", "tekken"])
def test_the_chosen_backend_equals_the_reference_on_every_volatile_code_point(infos, encoders, name):
    """fastokens split " \\u180ex" unlike tiktoken (U+180E, Mongolian vowel separator, was white space before Unicode
    6.3) and the check never saw one: a .tiktoken corpus holding it got other ids than the reference. The check's
    probes hold every such code point now, and fastokens is given tiktoken's white space explicitly."""
    info = infos[name]
    choice = select_backend(info, ["Hello world"])
    texts = _code_point_texts(seed=len(name))
    got = encoders[(name, choice.backend)].encode_batch(texts)
    want = encoders[(name, choice.reference)].encode_batch(texts)
    bad = [texts[i][:12] for i in range(len(texts)) if not np.array_equal(got[0][got[1][i]:got[1][i + 1]],
                                                                          want[0][want[1][i]:want[1][i + 1]])]
    assert not bad, (choice.backend, len(bad), bad[:5])
    assert choice.backend == "fastokens", choice.rejected  # exact and still the fast one


@pytest.mark.parametrize("seed", range(4))
def test_a_candidate_differing_on_any_volatile_code_point_is_rejected(infos, seed):
    """A fast backend that classes one such code point differently (here: takes it for a space) is caught by the
    probes alone, whatever the sample."""
    import random

    from pretok_lib.tokenizer.select import unicode_probes

    chars = sorted({ch for text in unicode_probes() for ch in text} - set(" x'l1"))
    ch = random.Random(seed).choice(chars)
    good = make_encoder(infos["cl100k_tt"], "fastokens").encode_batch
    off = lambda texts: good([t.replace(ch, " ") for t in texts])  # noqa: E731
    choice = select_backend(infos["cl100k_tt"], ["Hello world"], encoders={"fastokens": off})
    assert choice.backend == "tiktoken" and "ids differ on probe" in choice.rejected["fastokens"], (hex(ord(ch)),)


JUNK = [None, 0, -1, 1.5, "", "x", [], {}, [1], {"a": 1}, True, {"content": None}, {"content": 5}, {"content": ["x"]}]


def _mutations(obj, rng, n: int):
    """n copies of `obj`, each with one seeded value (at any depth) deleted or replaced by junk of another shape."""
    import copy

    def paths(o, pre=()):
        if pre:
            yield pre
        items = o.items() if isinstance(o, dict) else enumerate(o[:3]) if isinstance(o, list) else ()
        for k, v in items:
            yield from paths(v, (*pre, k))

    every = list(paths(obj))
    for _ in range(n):
        o = copy.deepcopy(obj)
        at = rng.choice(every)
        parent = o
        for k in at[:-1]:
            parent = parent[k]
        if isinstance(parent, dict) and rng.random() < 0.3:
            del parent[at[-1]]
        else:
            parent[at[-1]] = rng.choice(JUNK)
        yield at, o


@pytest.mark.parametrize("seed", range(3))
def test_misshapen_post_processor_or_special_tokens_config_is_one_line(tmp_path, seed):
    """A TemplateProcessing post_processor or a tokenizer_config.json / special_tokens_map.json role of another shape
    (a list, a number, a dict without a string content) raised KeyError/TypeError/IndexError tracebacks from
    load_tokenizer; now one line naming the file (or the tokenizer loads, when the shape does not matter)."""
    import random

    rng = random.Random(seed)
    gpt2 = json.loads(GPT2_JSON.read_text(encoding="utf-8"))
    gpt2["post_processor"] = {
        "type": "TemplateProcessing", "pair": [],
        "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [50256], "tokens": ["<|endoftext|>"]}}}
    tok_json = json.dumps(gpt2)
    config = {"bos_token": "<|endoftext|>", "eos_token": {"content": "<|endoftext|>"}, "pad_token": None}
    cases = [("tokenizer.json", {"post_processor": pp}) for _, pp in _mutations(gpt2["post_processor"], rng, 12)]
    cases += [(name, cfg) for name in ("tokenizer_config.json", "special_tokens_map.json")
              for _, cfg in _mutations(config, rng, 6)]
    for n, (name, change) in enumerate(cases):
        d = tmp_path / f"case{n}"
        d.mkdir()
        (d / "tokenizer.json").write_text(json.dumps({**gpt2, **change}) if name == "tokenizer.json" else tok_json)
        if name != "tokenizer.json":
            (d / name).write_text(json.dumps(change))
        try:
            load_tokenizer(d)
        except PretokError as e:
            assert str(d / name) in str(e) and "\n" not in str(e), (name, change)
