"""What a tokenizer is: detect its kind, read its defining file, fingerprint it, find its special ids.

Kinds: "hf-json" (tokenizer.json), "hf-auto" (transformers AutoTokenizer: a directory without tokenizer.json or a
hub name), "sentencepiece" (.model), "tiktoken" (OpenAI .tiktoken), "tekken" (Mistral tekken JSON).
The fingerprint is "sha256:<hex>" of the file bytes that define the tokenizer (tokenizer.json, the .model, the
.tiktoken or the tekken JSON; inside a directory, that one file, the same as `sha256sum`). For "hf-auto" it is
the sha256 of the fast tokenizer's serialized tokenizer.json text (of the sorted vocab JSON for a slow tokenizer).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import PretokError
from .specials import (WELL_KNOWN, Source, added_special_tokens, by_name, config_source, hub_config_source, resolve,
                       template_roles, transformers_added_source, well_known)

TIKTOKEN_STEMS = ("r50k_base", "p50k_base", "cl100k_base", "o200k_base")
_HUB_ID = re.compile(r"^\w[\w.-]*(/\w[\w.-]*)?$")
_FILE_SUFFIXES = (".json", ".model", ".tiktoken", ".txt", ".v3")


@dataclass(frozen=True)
class TokenizerInfo:
    """What identifies a tokenizer: enough to rebuild any backend for it in a fresh process."""

    spec: str
    kind: str
    fingerprint: str
    vocab_size: int
    bos_id: int | None
    eos_id: int | None
    pad_id: int | None
    # {role: the source that decided bos/eos/pad (`specials.py`), None when none declares it}; empty from `identify`
    special_sources: dict[str, str | None] = field(default_factory=dict, hash=False)

    def to_dict(self) -> dict:
        return asdict(self)


def load_tokenizer(spec: str | os.PathLike) -> TokenizerInfo:
    """Detect the kind of `spec` (file, directory or hub name), load it once and describe it."""
    spec = os.fspath(spec)
    path = Path(spec).expanduser()
    if not path.exists():
        if _HUB_ID.match(spec) and not spec.endswith(_FILE_SUFFIXES):
            return _info_hf_auto(spec)
        raise PretokError("no such tokenizer file or directory", spec)
    kind, file = _detect_dir(path) if path.is_dir() else ("", path)
    if kind == "hf-auto":
        return _info_hf_auto(spec)
    data = _read_bytes(file)
    kind, obj = _file_kind(file, data)
    loaders = {"hf-json": _info_hf_json, "tiktoken": _info_tiktoken, "sentencepiece": _info_sentencepiece,
               "tekken": _info_tekken}
    return loaders[kind](spec, file, data, obj)


def identify(spec: str | os.PathLike) -> TokenizerInfo:
    """What `make_encoder` needs (spec, kind, fingerprint) without building the tokenizer, so worker processes can
    start building theirs at once; vocab_size and the special ids are not read (0 / None). Directories and hub
    names that need transformers are loaded fully."""
    spec = os.fspath(spec)
    path = Path(spec).expanduser()
    if not path.exists():
        return load_tokenizer(spec)
    kind, file = _detect_dir(path) if path.is_dir() else ("", path)
    if kind == "hf-auto":
        return load_tokenizer(spec)
    data = _read_bytes(file)
    return TokenizerInfo(spec, _file_kind(file, data)[0], _sha(data), 0, None, None, None)


def _detect_dir(path: Path) -> tuple[str, Path | None]:
    """(kind, defining file) of a tokenizer directory; tokenizer.json wins, then a single *.model/*.tiktoken/tekken."""
    if (path / "tokenizer.json").is_file():
        return "hf-json", path / "tokenizer.json"
    for pattern, kind in (("*.model", "sentencepiece"), ("*.tiktoken", "tiktoken"), ("tekken*.json", "tekken")):
        found = sorted(path.glob(pattern))
        if len(found) == 1:
            return kind, found[0]
    if any((path / n).is_file() for n in ("tokenizer_config.json", "vocab.json", "vocab.txt")):
        return "hf-auto", None
    raise PretokError("no tokenizer in this directory (expected tokenizer.json, one *.model, one *.tiktoken, "
                      "one tekken*.json, or tokenizer_config.json for transformers)", path)


def _file_kind(path: Path, data: bytes) -> tuple[str, Any]:
    """Kind of a tokenizer file from its name and bytes (and the parsed JSON when it is JSON)."""
    if path.suffix == ".tiktoken":
        return "tiktoken", None
    if data.lstrip()[:1] == b"{":
        obj = _parse_json(data, path)
        config = obj.get("config") if isinstance(obj, dict) else None
        if isinstance(config, dict) and "pattern" in config and isinstance(obj.get("vocab"), list):
            return "tekken", obj
        if isinstance(obj, dict) and "model" in obj:
            return "hf-json", obj
        raise PretokError("unknown tokenizer format: JSON is neither a HF tokenizer.json nor a Mistral tekken file", path)
    if ".model" in path.name or data[:1] == b"\n":
        return "sentencepiece", None
    raise PretokError("unknown tokenizer format (expected tokenizer.json, a SentencePiece .model, "
                      "a .tiktoken file or a Mistral tekken .json)", path)


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise PretokError(f"cannot read tokenizer file: {e.strerror or e}", path) from None


def _parse_json(data: bytes, path: Path) -> Any:
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise PretokError(f"corrupt or truncated JSON: {e}", path) from None


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _hf_from_str(text: str, where: str | Path) -> Any:
    """HF `tokenizers.Tokenizer` from tokenizer.json text, reading special-token strings as text."""
    try:
        return _hf_build(text)
    except Exception as e:  # tokenizers raises bare Exception
        raise PretokError(f"not a valid HF tokenizer.json: {e}", where) from None


@functools.lru_cache(maxsize=2)
def _hf_build(text: str) -> Any:
    """Cached: the reference encoder of a check and of later checks in this process share one build (~0.1 s
    for GPT-2). The returned tokenizer is only read from (encode/decode), never reconfigured."""
    import tokenizers

    tok = tokenizers.Tokenizer.from_str(text)
    tok.encode_special_tokens = True
    return tok


def json_vocab(obj: dict, path: Path) -> dict[str, int]:
    """token → id of a parsed tokenizer.json as the HF library reads it (`get_vocab(with_added_tokens=True)`):
    the model's vocabulary (a dict, or Unigram's [piece, score] list: ids by position), added tokens over it.
    Read from the JSON, without building the tokenizer (~0.1-0.4 s): the backends build it in the workers."""
    model = obj.get("model")
    vocab = model.get("vocab") if isinstance(model, dict) else None
    try:
        if isinstance(vocab, list):
            out = {piece[0]: i for i, piece in enumerate(vocab)}
        elif isinstance(vocab, dict):
            out = dict(vocab)
        else:
            raise ValueError("model.vocab is missing")
        out.update({t["content"]: t["id"] for t in obj.get("added_tokens") or []})
        if not all(type(i) is int and i >= 0 for i in out.values()):
            raise ValueError("a token id is not a non-negative integer")
        if not all(isinstance(t, str) for t in out):
            raise ValueError("a token is not a string")
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise PretokError(f"not a valid HF tokenizer.json: {e!r}", path) from None
    if not out:
        raise PretokError("tokenizer.json has an empty vocabulary", path)
    return out


def _info_hf_json(spec: str, path: Path, data: bytes, obj: dict) -> TokenizerInfo:
    vocab = json_vocab(obj, path)
    ids, where = resolve([*config_source(path.parent, vocab.get),
                          ("post_processor", template_roles(obj.get("post_processor"), path)),
                          ("added_tokens", by_name(added_special_tokens(obj))), (WELL_KNOWN, well_known(vocab.get))])
    return TokenizerInfo(spec, "hf-json", _sha(data), max(vocab.values()) + 1, *ids, where)


def _auto_load(spec: str) -> tuple[Any, str]:
    """(transformers tokenizer, fingerprint) for a directory or hub name."""
    try:
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(spec)
    except Exception as e:
        offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
        if offline and not Path(spec).exists():
            raise PretokError(f"cannot load tokenizer '{spec}': not a local path and the hub is offline") from None
        raise PretokError(f"cannot load tokenizer with transformers: {str(e).splitlines()[0]}", spec) from None
    if len(tok) == 0:
        raise PretokError("transformers built an empty tokenizer (is tokenizer.json missing?)", spec)
    if tok.is_fast:
        return tok, _sha(tok.backend_tokenizer.to_str().encode())
    return tok, _sha(json.dumps(sorted(tok.get_vocab().items()), ensure_ascii=False).encode())


def _info_hf_auto(spec: str) -> TokenizerInfo:
    tok, fingerprint = _auto_load(spec)
    vocab = tok.get_vocab()
    config = config_source(Path(spec), vocab.get) if Path(spec).is_dir() else hub_config_source(tok)
    ids, where = resolve([*config, transformers_added_source(tok), (WELL_KNOWN, well_known(vocab.get))])
    return TokenizerInfo(spec, "hf-auto", fingerprint, max(vocab.values()) + 1, *ids, where)


def _info_sentencepiece(spec: str, path: Path, data: bytes, obj: None) -> TokenizerInfo:
    sp = _sp_from_bytes(data, path)
    own = {"bos": sp.bos_id(), "eos": sp.eos_id(), "pad": sp.pad_id()}
    lookup = lambda s: (i if sp.id_to_piece(i := sp.piece_to_id(s)) == s else None)  # noqa: E731
    ids, where = resolve([*config_source(path.parent, lookup),
                          ("sentencepiece model", {k: v for k, v in own.items() if v >= 0}),
                          (WELL_KNOWN, well_known(lookup))])
    return TokenizerInfo(spec, "sentencepiece", _sha(data), sp.get_piece_size(), *ids, where)


def _sp_from_bytes(data: bytes, path: Path) -> Any:
    import sentencepiece
    try:
        return sentencepiece.SentencePieceProcessor(model_proto=data)
    except Exception as e:
        raise PretokError(f"not a valid SentencePiece model: {str(e).splitlines()[0]}", path) from None


def _tiktoken_constants(path: Path) -> tuple[str, dict[str, int]]:
    """(pat_str, special_tokens) of the OpenAI encoding named by the file stem, from tiktoken_ext."""
    import tiktoken_ext.openai_public as openai_public
    if path.stem not in TIKTOKEN_STEMS:
        raise PretokError(f"unknown tiktoken encoding '{path.stem}': name the file one of "
                          f"{', '.join(s + '.tiktoken' for s in TIKTOKEN_STEMS)}", path)
    from unittest import mock  # imported here: it pulls in asyncio (~30 ms at every worker start)

    with mock.patch.object(openai_public, "load_tiktoken_bpe", lambda *a, **k: {}):  # no download: constants only
        c = openai_public.ENCODING_CONSTRUCTORS[path.stem]()
    return c["pat_str"], c["special_tokens"]


def _parse_tiktoken(data: bytes, path: Path) -> dict[bytes, int]:
    """Parse a .tiktoken file ourselves: tiktoken.load caches local paths in /tmp and can serve stale bytes."""
    ranks: dict[bytes, int] = {}
    seen: set[int] = set()
    for n, line in enumerate(data.splitlines(), 1):
        try:
            if line:
                token, rank = line.split()
                token, rank = base64.b64decode(token, validate=True), int(rank)
                if rank < 0 or token in ranks or rank in seen:
                    raise ValueError("a negative or repeated rank, or a repeated token")
                ranks[token] = rank
                seen.add(rank)
        except ValueError as e:
            why = f": {e}" if "repeated" in str(e) else ""
            raise PretokError(f"corrupt .tiktoken file at line {n}{why}", path) from None
    if not ranks:
        raise PretokError("empty .tiktoken file", path)
    return ranks


def _info_tiktoken(spec: str, path: Path, data: bytes, obj: None) -> TokenizerInfo:
    _pattern, specials = _tiktoken_constants(path)
    ranks = _parse_tiktoken(data, path)
    lookup = lambda s: specials.get(s, ranks.get(s.encode()))  # noqa: E731
    named: Source = ("tiktoken special_tokens", by_name(sorted(specials.items(), key=lambda t: t[1])))
    ids, where = resolve([named, (WELL_KNOWN, well_known(lookup))])
    return TokenizerInfo(spec, "tiktoken", _sha(data), max([*ranks.values(), *specials.values()]) + 1, *ids, where)


def _tekken_parts(obj: dict, path: Path) -> tuple[str, list[dict], list[str]]:
    """(pattern, vocab entries kept, special token strings by id) of a tekken file, as Tekkenizer reads it."""
    try:
        config, vocab = obj["config"], obj["vocab"]
        n_special, size = config["default_num_special_tokens"], config["default_vocab_size"]
        specials = obj.get("special_tokens")
        if specials is None:
            from mistral_common.tokens.tokenizers.tekken import Tekkenizer
            specials = Tekkenizer.DEPRECATED_SPECIAL_TOKENS
        names = [str(getattr(t["token_str"], "value", t["token_str"])) for t in specials]
        names += [f"<SPECIAL_{i}>" for i in range(len(names), n_special)]
        kept = vocab[: size - n_special]
        if len(kept) != size - n_special or any(t["rank"] != i for i, t in enumerate(kept)):
            raise ValueError("vocab ranks are not 0..n-1")
        return config["pattern"], kept, names
    except (KeyError, TypeError, ValueError) as e:
        raise PretokError(f"invalid tekken file: {e!r}", path) from None


def _info_tekken(spec: str, path: Path, data: bytes, obj: dict) -> TokenizerInfo:
    _pattern, _kept, names = _tekken_parts(obj, path)
    own = {r: names.index(s) for r, s in zip(("bos", "eos", "pad"), ("<s>", "</s>", "<pad>")) if s in names}
    ids, where = resolve([("tekken special_tokens", own)])  # as Tekkenizer.bos_id...
    return TokenizerInfo(spec, "tekken", _sha(data), obj["config"]["default_vocab_size"], *ids, where)
