"""The backends of a tokenizer: build one (`make_encoder`), fastest first (`backends_for`), as an `Encoder`.

Encoding never adds special tokens and reads special-token strings in raw text ("<|endoftext|>", "<s>") as
ordinary text. Workers rebuild an encoder from (info, backend) alone and check the fingerprint again.
"""

from __future__ import annotations

import base64
import itertools
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import PretokError
from ..machine.cpu_affinity import pin_to_one_cpu
from .files import (TokenizerInfo, _auto_load, _detect_dir, _hf_from_str, _parse_json, _parse_tiktoken, _read_bytes,
                    _sha, _sp_from_bytes, _tekken_parts, _tiktoken_constants)

CANDIDATES = {  # fastest first; the last one is the reference implementation
    "hf-json": ["fastokens", "hf-tokenizers"],
    "hf-auto": ["fastokens", "hf-tokenizers", "transformers"],
    "tiktoken": ["fastokens", "tiktoken"],
    "sentencepiece": ["sentencepiece"],
    "tekken": ["fastokens", "tiktoken", "mistral-common"],
}


class BackendUnavailable(PretokError):
    """A candidate backend that cannot be built for this tokenizer (any exception while building it); `reason` is
    the one-line cause. Picklable with its fields (it crosses from the zygote to the main process)."""

    def __init__(self, backend: str, reason: str, path: str | os.PathLike | None = None):
        super().__init__(f"cannot build the {backend} backend: {reason}", path)
        self.backend, self.reason = backend, reason

    def __reduce__(self):
        return type(self), (self.backend, self.reason, self.path)


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
        try:
            tmp.write_bytes(data)
            os.replace(tmp, path)
        except BaseException:  # a full disk left a partial copy that kept the space (and filled it for others)
            tmp.unlink(missing_ok=True)
            raise
    return path


def _fastokens_file(path: Path, data: bytes, name: str) -> str:
    """A path fastokens can open to read `data`, the file's fingerprinted bytes: the file itself, or a copy in
    the cache (`_cached`) when its path is not valid UTF-8 (bytes of another encoding in a directory name, a
    non-UTF-8 locale's undecodable arguments), which fastokens, taking a Rust string, refused to build from."""
    file = os.fspath(path)
    try:
        file.encode("utf-8")
    except UnicodeEncodeError:
        return str(_cached(name, data))
    return file


# Unicode's White_Space, which tiktoken's regex engine means by \s. fastokens, on tiktoken's patterns, takes U+180E
# for white space too (Unicode before 6.3): " \u180ex" was [" ", "\u180ex"] there, [" \u180e", "x"] in tiktoken.
WHITE_SPACE = "\t-\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"


def explicit_white_space(pattern: str) -> str:
    """`pattern` with \\s and \\S spelled out as Unicode's White_Space (inside a class too), for fastokens to split
    text as tiktoken does."""
    out, i, in_class = [], 0, False
    while i < len(pattern):
        two = pattern[i:i + 2]
        if two == "\\s":
            out.append(WHITE_SPACE if in_class else f"[{WHITE_SPACE}]")
        elif two == "\\S" and not in_class:
            out.append(f"[^{WHITE_SPACE}]")
        elif two[0] == "\\":
            out.append(two)
        else:
            in_class = (in_class or two[0] == "[") and not (in_class and two[0] == "]")
            out.append(two[0])
            i += 1
            continue
        i += 2
    return "".join(out)


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
        file = _fastokens_file(path, data, f"{path.stem}-{info.fingerprint[7:]}.tiktoken")
        return fastokens_encoder(fastokens.Tokenizer.from_tiktoken(file, pattern=explicit_white_space(pattern),
                                                                   special_tokens=specials))
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


def limit_threads_to_one_cpu(cpu_index: int | None = None) -> None:
    """Make this process's tokenizers single-threaded (call before the first encode); pin to one allowed
    CPU when cpu_index is given (fastokens sizes its thread pool from the affinity mask)."""
    os.environ["RAYON_NUM_THREADS"] = "1"
    os.environ["FASTOKENS_BPE_THREADS"] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ["OMP_NUM_THREADS"] = "1"
    if cpu_index is not None:
        pin_to_one_cpu(cpu_index)


def id_dtype_for(vocab_size: int) -> str:
    """Smallest Megatron-compatible id dtype: "uint16" when every id < 65536, else "int32" (no uint32 code)."""
    if not 0 < vocab_size <= 2**31:
        raise PretokError(f"vocabulary size {vocab_size} does not fit int32 token ids")
    return "uint16" if vocab_size <= 65536 else "int32"
