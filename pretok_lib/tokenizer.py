"""Load any tokenizer, fingerprint it, pick the fastest backend that gives the reference's exact ids, encode to numpy.

Kinds: "hf-json" (tokenizer.json), "hf-auto" (transformers AutoTokenizer: a directory without tokenizer.json or a
hub name), "sentencepiece" (.model), "tiktoken" (OpenAI .tiktoken), "tekken" (Mistral tekken JSON).
Encoding never adds special tokens and reads special-token strings in raw text ("<|endoftext|>", "<s>") as
ordinary text. The fingerprint is "sha256:<hex>" of the file bytes that define the tokenizer (tokenizer.json,
the .model, the .tiktoken or the tekken JSON; inside a directory, that one file, the same as `sha256sum`). For
"hf-auto" it is the sha256 of the fast tokenizer's serialized tokenizer.json text (of the sorted vocab JSON
for a slow tokenizer). Workers rebuild an encoder from (info, backend) alone and check the fingerprint again.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import itertools
import json
import os
import re
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from .errors import PretokError

CANDIDATES = {  # fastest first; the last one is the reference implementation
    "hf-json": ["fastokens", "hf-tokenizers"],
    "hf-auto": ["fastokens", "hf-tokenizers", "transformers"],
    "tiktoken": ["fastokens", "tiktoken"],
    "sentencepiece": ["sentencepiece"],
    "tekken": ["fastokens", "tiktoken", "mistral-common"],
}
TIKTOKEN_STEMS = ("r50k_base", "p50k_base", "cl100k_base", "o200k_base")
_KNOWN = {  # well-known special strings, tried in order when nothing else names the role
    "bos": ("<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>", "<|endoftext|>"),
    "eos": ("<|end_of_text|>", "</s>", "<eos>", "<|endoftext|>"),
    "pad": ("<pad>", "<|pad|>", "[PAD]"),
}
_HUB_ID = re.compile(r"^\w[\w.-]*(/\w[\w.-]*)?$")
_FILE_SUFFIXES = (".json", ".model", ".tiktoken", ".txt", ".v3")
_PROBES = [
    "", " ", "\n", "\r\n", "a\r\nb\r\n\r\nc\r", "Hello world", " Hello  world ", "HELLO World hello",
    "\t\tindented\n\n\n   spaces   \n", "x" + " " * 40 + "y", " " * 100, "\n" * 50, "\t \n \t\n" * 10,
    "12345678901234567890", "3.14159 1,000,000 2024-01-01 0x1F 1e-9 007 ١٢٣", "a1b22c333d4444 " + "9" * 64,
    "café naïve façade Ærø Ångström œuvre ß", "日本語のテキストと中文文本。한국어 ไทย العربية עברית",
    "😀👍🏽👨‍👩‍👧 🇫🇷 ❤️", "e\u0301 \u00a0nbsp \u200bzero \u2028sep \u3000wide \ufeffbom",
    "def f(x):\n    return {'a': [1, 2]}  # comment\n\n\nclass A:\n\tpass\n",
    '<html><body class="x">&amp;</body></html> {"k": [null, true]}', "I'm you'RE they'll we'VE it's O'Neil",
    " @-@ <unk> = = Title = = \n", "\x00\x01\x7f\x1b[0m control", "a" * 3000, "ab " * 1000, "\ud7ff\ue000\U0010fffd",
]


class BackendUnavailable(PretokError):
    """A candidate backend that cannot be built for this tokenizer (any exception while building it); `reason` is
    the one-line cause. Picklable with its fields (it crosses from the zygote to the main process)."""

    def __init__(self, backend: str, reason: str, path: str | os.PathLike | None = None):
        super().__init__(f"cannot build the {backend} backend: {reason}", path)
        self.backend, self.reason = backend, reason

    def __reduce__(self):
        return type(self), (self.backend, self.reason, self.path)


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

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class BackendChoice:
    """The backend picked for a run and the evidence (docs/tokens compared with the reference, rejections)."""

    backend: str
    reference: str
    checked_docs: int
    checked_tokens: int
    rejected: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


class Encoder:
    """One backend of one tokenizer: never adds special tokens nor reads special strings in text as control ids."""

    def __init__(self, backend: str, encode_many: Callable[[list[str]], Any], decode: Callable[[list[int]], str],
                 special_tokens: Sequence[str] = (), shift: int = 0, flat: bool = False):
        """encode_many returns per-text id lists, or (flat ids, offsets) when flat; ids below `shift` are the
        special tokens and the backend's ids are shifted by it (tekken)."""
        self.backend, self.special_tokens = backend, tuple(special_tokens)  # special strings, for probes
        self._encode, self._decode, self._shift, self._flat = encode_many, decode, shift, flat

    def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """ids: flat np.uint32 array of all texts' token ids (may be read-only); offsets: np.int64 array of
        len(texts)+1 (text i is ids[offsets[i]:offsets[i+1]])."""
        texts = list(texts)
        ids, offsets = self._encode(texts) if self._flat else _flatten(self._encode(texts) if texts else [])
        return (ids + np.uint32(self._shift) if self._shift else ids), offsets

    def decode(self, ids: np.ndarray | list[int]) -> str:
        """The tokenizer's own decoding; special tokens are kept."""
        ids = [int(i) for i in ids]
        return _decode_shifted(ids, self._shift, self.special_tokens, self._decode) if self._shift else self._decode(ids)


def _flatten(lists: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Per-text id lists -> (flat uint32 ids, int64 offsets)."""
    offsets = np.zeros(len(lists) + 1, np.int64)
    offsets[1:] = np.cumsum(np.fromiter(map(len, lists), np.int64, len(lists)))
    return np.fromiter(itertools.chain.from_iterable(lists), np.uint32, int(offsets[-1])), offsets


def _decode_shifted(ids: list[int], shift: int, specials: Sequence[str], decode: Callable[[list[int]], str]) -> str:
    """Decode ids whose first `shift` values are special tokens (tekken layout), keeping their strings."""
    parts = []
    for special, group in itertools.groupby(ids, lambda i: i < shift):
        group = list(group)
        parts.append("".join(specials[i] for i in group) if special else decode([i - shift for i in group]))
    return "".join(parts)


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


def _config(directory: Path) -> dict:
    """special_tokens_map.json overlaid by tokenizer_config.json (empty when neither exists)."""
    out: dict = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        if (directory / name).is_file():
            obj = _parse_json(_read_bytes(directory / name), directory / name)
            out.update(obj if isinstance(obj, dict) else {})
    return out


def _special_ids(lookup: Callable[[str], int | None], config: dict, own: dict[str, int | None]) -> list[int | None]:
    """bos/eos/pad ids: tokenizer_config.json first (an explicit null means none), then the tokenizer's own
    definitions, then well-known special strings present in the vocab."""
    out = []
    for role, known in _KNOWN.items():
        if f"{role}_token" in config:
            tok = config[f"{role}_token"]
            tok = tok.get("content") if isinstance(tok, dict) else tok
            out.append(lookup(tok) if tok else None)
        elif own.get(role) is not None:
            out.append(own[role])
        else:
            out.append(next((i for s in known if (i := lookup(s)) is not None), None))
    return out


def _template_roles(pp: dict | None) -> dict[str, int]:
    """bos/eos ids a HF TemplateProcessing post-processor puts before/after a single sequence."""
    if not isinstance(pp, dict) or pp.get("type") != "TemplateProcessing":
        return {}
    items = pp.get("single", [])
    seq = next((i for i, item in enumerate(items) if "Sequence" in item), 0)
    ids = [pp["special_tokens"][item["SpecialToken"]["id"]]["ids"][0] for item in items if "SpecialToken" in item]
    before = sum("SpecialToken" in item for item in items[:seq])
    return {**({"bos": ids[0]} if before else {}), **({"eos": ids[-1]} if len(ids) > before else {})}


def _hf_from_str(text: str, where: str | Path) -> Any:
    """HF `tokenizers.Tokenizer` from tokenizer.json text, reading special-token strings as text."""
    try:
        return _hf_build(text)
    except Exception as e:  # tokenizers raises bare Exception
        raise PretokError(f"not a valid HF tokenizer.json: {e}", where) from None


@functools.lru_cache(maxsize=2)
def _hf_build(text: str) -> Any:
    """Cached: loading a tokenizer and building its reference encoder share one build (~0.1 s for GPT-2).
    The returned tokenizer is only read from (encode/decode), never reconfigured."""
    import tokenizers

    tok = tokenizers.Tokenizer.from_str(text)
    tok.encode_special_tokens = True
    return tok


def _info_hf_json(spec: str, path: Path, data: bytes, obj: dict) -> TokenizerInfo:
    tok = _hf_from_str(data.decode("utf-8"), path)
    vocab = tok.get_vocab(with_added_tokens=True)
    if not vocab:
        raise PretokError("tokenizer.json has an empty vocabulary", path)
    ids = _special_ids(tok.token_to_id, _config(path.parent), _template_roles(obj.get("post_processor")))
    return TokenizerInfo(spec, "hf-json", _sha(data), max(vocab.values()) + 1, *ids)


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
    config = _config(Path(spec)) if Path(spec).is_dir() else {  # a hub config's explicit nulls are not visible
        f"{r}_token": getattr(tok, f"{r}_token") for r in _KNOWN if getattr(tok, f"{r}_token", None)}
    ids = _special_ids(vocab.get, config, {})
    return TokenizerInfo(spec, "hf-auto", fingerprint, max(vocab.values()) + 1, *ids)


def _info_sentencepiece(spec: str, path: Path, data: bytes, obj: None) -> TokenizerInfo:
    sp = _sp_from_bytes(data, path)
    own = {"bos": sp.bos_id(), "eos": sp.eos_id(), "pad": sp.pad_id()}
    lookup = lambda s: (i if sp.id_to_piece(i := sp.piece_to_id(s)) == s else None)  # noqa: E731
    ids = _special_ids(lookup, _config(path.parent), {k: (v if v >= 0 else None) for k, v in own.items()})
    return TokenizerInfo(spec, "sentencepiece", _sha(data), sp.get_piece_size(), *ids)


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
    ids = _special_ids(lookup, {}, {})
    return TokenizerInfo(spec, "tiktoken", _sha(data), max([*ranks.values(), *specials.values()]) + 1, *ids)


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
    ids = [names.index(s) if s in names else None for s in ("<s>", "</s>", "<pad>")]  # as Tekkenizer.bos_id...
    return TokenizerInfo(spec, "tekken", _sha(data), obj["config"]["default_vocab_size"], *ids)


def backends_for(info: TokenizerInfo) -> list[str]:
    """Candidate backends, fastest first; the last one is the reference (canonical) implementation."""
    return list(CANDIDATES[info.kind])


def make_encoder(info: TokenizerInfo, backend: str) -> Encoder:
    """Build `backend` for `info` (cheap enough for a fresh worker); the source's fingerprint is re-checked."""
    if backend not in CANDIDATES.get(info.kind, []):
        raise PretokError(f"backend '{backend}' is not available for {info.kind} tokenizers "
                          f"(choose from {', '.join(CANDIDATES.get(info.kind, []))})", info.spec)
    try:
        return _BUILDERS[info.kind](info, backend)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # any failure, a Rust panic (a BaseException) included, rejects this candidate
        raise BackendUnavailable(backend, _reason(e), info.spec) from None


def _reason(e: BaseException) -> str:
    """`Type: first line of the message` (a PretokError's message without its path prefix)."""
    msg = str(e)
    path = getattr(e, "path", None)
    if isinstance(e, PretokError) and path and msg.startswith(f"{path}: "):
        msg = msg[len(path) + 2:]
    first = msg.splitlines()[0] if msg.strip() else ""
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


def build_first(info: TokenizerInfo, force: str | None = None) -> tuple[str | None, Encoder | None, dict[str, str]]:
    """(backend, encoder, failures): the first candidate, fastest first (only `force` when given), that can be
    built, and why each one before it could not. (None, None, failures) when none can: see `unbuildable`.
    Deterministic: candidates are tried in the fixed order of `backends_for`."""
    failures: dict[str, str] = {}
    for backend in [force] if force else backends_for(info):
        try:
            return backend, make_encoder(info, backend), failures
        except BackendUnavailable as e:
            failures[backend] = e.reason
    return None, None, failures


def unbuildable(info: TokenizerInfo, force: str | None, failures: dict[str, str]) -> PretokError:
    """The one-line error of a run where no candidate (or the forced backend) could be built."""
    if force:
        return PretokError(f"backend '{force}' cannot be built for this tokenizer: {failures.get(force, '?')}",
                           info.spec)
    why = "; ".join(f"{b}: {r}" for b, r in failures.items())
    return PretokError(f"no tokenizer backend can be built from this file ({why})", info.spec)


def _source(info: TokenizerInfo) -> tuple[Path, bytes]:
    """The defining file of a file-based tokenizer and its bytes, checked against the fingerprint."""
    path = Path(info.spec).expanduser()
    file = _detect_dir(path)[1] if path.is_dir() else path
    data = _read_bytes(file) if file else b""
    if _sha(data) != info.fingerprint:
        raise PretokError(f"tokenizer changed since it was fingerprinted ({info.fingerprint[:19]}...)", file or path)
    return file, data


def _cached(name: str, data: bytes) -> Path:
    """Path of a derived file holding exactly `data` in $PRETOK_CACHE_DIR (default: a per-user temp dir)."""
    path = Path(os.environ.get("PRETOK_CACHE_DIR") or Path(tempfile.gettempdir()) / f"pretok-{os.getuid()}") / name
    if not path.is_file() or path.read_bytes() != data:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    return path


def fastokens_encoder(tok: Any, specials: Sequence[str] = (), shift: int = 0) -> Encoder:
    """fastokens' zero-copy bulk path: little-endian uint32 ids + uint64 offsets."""
    def encode(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        ids, offsets = tok.encode_batch_flat(texts, add_special_tokens=False, split_special_tokens=True)
        return np.frombuffer(ids, np.uint32), np.frombuffer(offsets, np.uint64).astype(np.int64)
    return Encoder("fastokens", encode, lambda ids: tok.decode(ids, skip_special_tokens=False), specials, shift, True)


def _build_hf(info: TokenizerInfo, backend: str) -> Encoder:
    """fastokens or HF tokenizers on the tokenizer.json text (hf-auto: its fast tokenizer's); or transformers."""
    if info.kind == "hf-json":
        text = _source(info)[1].decode("utf-8")
    else:
        auto, fingerprint = _auto_load(info.spec)
        if fingerprint != info.fingerprint:
            raise PretokError(f"tokenizer changed since it was fingerprinted ({info.fingerprint[:19]}...)", info.spec)
        if backend == "transformers":
            return Encoder(backend, lambda ts: auto(ts, add_special_tokens=False, split_special_tokens=True)["input_ids"],
                           lambda ids: auto.decode(ids, skip_special_tokens=False), list(auto.get_added_vocab()))
        if not auto.is_fast:
            raise PretokError("a slow transformers tokenizer has no tokenizer.json for this backend", info.spec)
        text = auto.backend_tokenizer.to_str()
    if backend == "fastokens":
        import fastokens
        return fastokens_encoder(fastokens.Tokenizer.from_json_str(text))
    tok = _hf_from_str(text, info.spec)
    return Encoder(backend, lambda ts: [e.ids for e in tok.encode_batch_fast(ts, add_special_tokens=False)],
                   lambda ids: tok.decode(ids, skip_special_tokens=False),
                   [t.content for t in tok.get_added_tokens_decoder().values()])


def _build_tiktoken(info: TokenizerInfo, backend: str) -> Encoder:
    path, data = _source(info)
    pattern, specials = _tiktoken_constants(path)
    if backend == "fastokens":
        import fastokens
        return fastokens_encoder(fastokens.Tokenizer.from_tiktoken(str(path), pattern=pattern, special_tokens=specials))
    import tiktoken
    enc = tiktoken.Encoding(path.stem, pat_str=pattern, mergeable_ranks=_parse_tiktoken(data, path),
                            special_tokens=specials)  # a plain loop: encode_ordinary_batch spawns threads
    return Encoder(backend, lambda ts: [enc.encode_ordinary(t) for t in ts], enc.decode, list(specials))


def _build_sentencepiece(info: TokenizerInfo, backend: str) -> Encoder:
    path, data = _source(info)
    sp = _sp_from_bytes(data, path)
    return Encoder(backend, lambda ts: sp.encode(ts, num_threads=1), sp.decode)


def _build_tekken(info: TokenizerInfo, backend: str) -> Encoder:
    """mistral-common's Tekkenizer (reference), or its tiktoken BPE run directly with ids shifted by the
    number of special tokens (by tiktoken, or by fastokens from a derived .tiktoken rank file)."""
    path, data = _source(info)
    pattern, kept, names = _tekken_parts(_parse_json(data, path), path)
    if backend == "mistral-common":
        from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy
        from mistral_common.tokens.tokenizers.tekken import Tekkenizer
        tek = Tekkenizer.from_file(path)
        return Encoder(backend, lambda ts: [tek.encode(t, bos=False, eos=False) for t in ts],
                       lambda ids: tek.decode(ids, special_token_policy=SpecialTokenPolicy.KEEP), names)
    if backend == "fastokens":
        import fastokens
        ranks = _cached(f"tekken-{info.fingerprint[7:]}.tiktoken",
                        "".join(f"{t['token_bytes']} {t['rank']}\n" for t in kept).encode())
        tok = fastokens.Tokenizer.from_tiktoken(str(ranks), pattern=pattern, special_tokens={})
        return fastokens_encoder(tok, names, len(names))
    import tiktoken
    ranks_map = {base64.b64decode(t["token_bytes"]): t["rank"] for t in kept}
    enc = tiktoken.Encoding(path.stem, pat_str=pattern, mergeable_ranks=ranks_map, special_tokens={})
    return Encoder(backend, lambda ts: [enc.encode_ordinary(t) for t in ts], enc.decode, names, len(names))


_BUILDERS: dict[str, Callable[[TokenizerInfo, str], Encoder]] = {
    "hf-json": _build_hf, "hf-auto": _build_hf, "tiktoken": _build_tiktoken,
    "sentencepiece": _build_sentencepiece, "tekken": _build_tekken,
}


def probe_texts(special_tokens: Sequence[str]) -> list[str]:
    """Built-in hard cases plus every special-token string embedded in ordinary text."""
    specials = [s for s in special_tokens if s]
    embedded = [f"a{s}b {s} x{s}{s}\n{s}" for s in specials]
    return [*_PROBES, *embedded, " ".join(specials), "Hello " + "\n\n".join(specials[:50]) + " world"]


def select_backend(info: TokenizerInfo, sample_texts: list[str], force: str | None = None,
                   encoders: dict[str, Callable[[list[str]], tuple[np.ndarray, np.ndarray]]] | None = None
                   ) -> BackendChoice:
    """First candidate (or only `force`) whose ids equal the reference's on the samples plus built-in probes.

    A candidate that cannot be built (BackendUnavailable: any exception while building it, here or, through
    `encoders`, in the zygote) is rejected with its reason and the next one is tried. A forced backend is checked
    too: if it is not a candidate, cannot be built or its ids differ, PretokError says why in one line. The
    reference must build (it defines the exact ids).
    checked_docs/checked_tokens count the texts/reference tokens compared (0 when the reference itself runs).
    `encoders` may supply a candidate's `encode_batch` already built elsewhere (e.g. run by a worker process).
    """
    candidates = backends_for(info)
    reference = candidates[-1]
    if force is not None and force not in candidates:
        raise PretokError(f"backend '{force}' is not available for {info.kind} tokenizers "
                          f"(choose from {', '.join(candidates)})", info.spec)
    order = [force] if force else candidates
    rejected: dict[str, str] = {}
    if order[0] == reference:
        return BackendChoice(reference, reference, 0, 0, rejected)
    ref = make_encoder(info, reference)
    texts = [*sample_texts, *probe_texts(ref.special_tokens)]
    try:
        want = ref.encode_batch(texts)
    except Exception as e:  # the reference defines the exact ids: without them nothing can be checked
        raise PretokError(f"the reference backend {reference} fails to encode the check's texts: {_reason(e)}",
                          info.spec) from None
    for backend in order:
        if backend == reference:
            return BackendChoice(reference, reference, 0, 0, rejected)
        try:
            encode = (encoders or {}).get(backend) or make_encoder(info, backend).encode_batch
            got = encode(texts)
        except BackendUnavailable as e:
            rejected[backend] = f"cannot be built: {e.reason}"
            if force:
                raise unbuildable(info, force, {force: e.reason}) from None
            continue
        except Exception as e:
            rejected[backend] = f"failed: {_reason(e)}"
            continue
        why = _mismatch(texts, len(sample_texts), got, want)
        if why is None:
            return BackendChoice(backend, reference, len(texts), int(want[0].size), rejected)
        rejected[backend] = why
    raise PretokError(f"forced backend '{force}' does not match {reference}: {rejected[force]}", info.spec)


def _mismatch(texts: list[str], n_samples: int, got: tuple[np.ndarray, np.ndarray],
              want: tuple[np.ndarray, np.ndarray]) -> str | None:
    """None when ids are identical, else where the first differing text is and how it differs."""
    (ids, offs), (ref_ids, ref_offs) = got, want
    if np.array_equal(offs, ref_offs) and np.array_equal(ids, ref_ids):
        return None
    for i in range(len(texts)):
        a, b = ids[offs[i]:offs[i + 1]], ref_ids[ref_offs[i]:ref_offs[i + 1]]
        if not np.array_equal(a, b):
            j = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
            where = f"sample text {i}" if i < n_samples else f"probe {texts[i][:40]!r}"
            return (f"ids differ on {where}: first at token {j} (got {a[j:j + 3].tolist()}, "
                    f"reference {b[j:j + 3].tolist()}; {len(a)} vs {len(b)} tokens)")
    return f"offsets shape {offs.shape} differs from reference {ref_offs.shape}"


def limit_threads_to_one_cpu(cpu_index: int | None = None) -> None:
    """Make this process's tokenizers single-threaded (call before the first encode); pin to one allowed
    CPU when cpu_index is given (fastokens sizes its thread pool from the affinity mask)."""
    os.environ["RAYON_NUM_THREADS"] = "1"
    os.environ["FASTOKENS_BPE_THREADS"] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ["OMP_NUM_THREADS"] = "1"
    if cpu_index is not None:
        allowed = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {allowed[cpu_index % len(allowed)]})


def id_dtype_for(vocab_size: int) -> str:
    """Smallest Megatron-compatible id dtype: "uint16" when every id < 65536, else "int32" (no uint32 code)."""
    if not 0 < vocab_size <= 2**31:
        raise PretokError(f"vocabulary size {vocab_size} does not fit int32 token ids")
    return "uint16" if vocab_size <= 65536 else "int32"
