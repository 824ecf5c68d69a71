"""A project tokenizer as a transformers tokenizer (`AutoTokenizer.from_pretrained` loads it offline), checked
to give the reference backend's exact ids.

tokenizer.json: `PreTrainedTokenizerFast(tokenizer_file=...)`; a transformers directory or hub name: its
`AutoTokenizer`; .tiktoken and Mistral tekken JSON: a byte-level BPE built from the ranks (transformers'
`TikTokenConverter` recipe; tekken ids shifted by its special tokens, which keep ids 0..n-1); SentencePiece
.model: transformers' `SpmConverter.build_tokenizer_from_spm_proto`. Every result is compared with the
reference implementation (tokenizer.py) on the project's probe texts, with special-token strings read as
text as training read them (`split_special_tokens=True`); one that differs is not used.
"""

from __future__ import annotations

import base64
import os
import re
from pathlib import Path
from typing import Any

from .. import tokenizer as T
from ..errors import PretokError


def _byte_level_bpe(ranks: dict[bytes, int], pattern: str, specials: dict[str, int], shift: int = 0) -> Any:
    """A `tokenizers.Tokenizer` running tiktoken's BPE: merges derived from the ranks (TikTokenConverter's
    recipe), ids shifted by `shift`, `specials` (name → id) as special added tokens."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    table = bytes_to_unicode()

    def text(b: bytes) -> str:
        return "".join(table[x] for x in b)

    vocab = {text(t): r + shift for t, r in ranks.items()}
    merges = []
    for t, r in ranks.items():
        pairs = [(t[:i], t[i:], r) for i in range(1, len(t)) if t[:i] in ranks and t[i:] in ranks]
        merges += sorted(pairs, key=lambda p: (ranks[p[0]], ranks[p[1]]))
    merges.sort(key=lambda p: p[2])
    vocab.update(specials)
    tok = Tokenizer(BPE(vocab, [(text(a), text(b)) for a, b, _ in merges], fuse_unk=False, ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_oniguruma(pattern)), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in sorted(specials, key=specials.get)])
    return tok


def _oniguruma(pattern: str) -> str:
    """tiktoken's (Rust `fancy-regex`) pattern for `tokenizers` (Oniguruma, Ruby syntax), where `X{n,m}+` is
    not possessive but a repetition of `X{n,m}`: written as the atomic group `(?>X{n,m})`."""
    return re.sub(r"(\\p\{\w+\}|\\[a-zA-Z]|\[[^\]]*\]|\.)(\{\d+(?:,\d*)?\})\+", r"(?>\1\2)", pattern)


def _backend(info: T.TokenizerInfo) -> Any:
    """The transformers tokenizer of `info` (not yet checked)."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if info.kind == "hf-auto":
        return AutoTokenizer.from_pretrained(info.spec)
    file, data = T._source(info)
    if info.kind == "hf-json":
        return PreTrainedTokenizerFast(tokenizer_file=str(file))
    if info.kind == "tiktoken":
        pattern, specials = T._tiktoken_constants(file)
        tok = _byte_level_bpe(T._parse_tiktoken(data, file), pattern, specials)
    elif info.kind == "tekken":
        pattern, kept, names = T._tekken_parts(T._parse_json(data, file), file)
        ranks = {base64.b64decode(t["token_bytes"]): t["rank"] for t in kept}
        tok = _byte_level_bpe(ranks, pattern, {n: i for i, n in enumerate(names)}, len(names))
    else:  # sentencepiece
        from transformers.convert_slow_tokenizer import SentencePieceExtractor, SpmConverter

        proto = SentencePieceExtractor(str(file)).proto
        tok = SpmConverter.build_tokenizer_from_spm_proto(proto, {p.piece: i for i, p in enumerate(proto.pieces)})
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def rust_os_error(e: Exception, path: Path) -> OSError | None:
    """The OSError inside a Rust library's exception (tokenizers, safetensors: "... (os error 28)"), or None."""
    code = re.search(r"\(os error (\d+)\)", str(e))
    if code is None:
        return None
    errno = int(code.group(1))
    return OSError(errno, os.strerror(errno), str(path))


def _set_special(tok: Any, info: T.TokenizerInfo) -> None:
    """bos/eos/pad tokens as the project's loader found them (generate stops at eos)."""
    for role in ("bos", "eos", "pad"):
        i = getattr(info, f"{role}_id")
        if i is not None and getattr(tok, f"{role}_token", None) is None:
            name = tok.convert_ids_to_tokens(i)
            if name is not None:
                setattr(tok, f"{role}_token", name)


def mismatch(tok: Any, info: T.TokenizerInfo) -> str | None:
    """Where `tok` first gives other ids than the reference backend on the probe texts, or None."""
    ref = T.make_encoder(info, T.backends_for(info)[-1])
    texts = T.probe_texts(ref.special_tokens)
    got = tok(texts, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    return T._mismatch(texts, 0, T._flatten(got), ref.encode_batch(texts))


def save(info: T.TokenizerInfo, directory: Path) -> None:
    """Write the transformers tokenizer of `info` into `directory` and check that `AutoTokenizer` loads it back
    with the reference's exact ids; a one-line PretokError naming the tokenizer when transformers cannot build
    one or its ids differ."""
    from transformers import AutoTokenizer

    try:
        tok = _backend(info)
        _set_special(tok, info)
        tok.save_pretrained(str(directory))
        loaded = AutoTokenizer.from_pretrained(str(directory))
    except (PretokError, OSError):
        raise
    except Exception as e:  # noqa: BLE001 - whatever a converter raises: one line
        err = rust_os_error(e, directory)
        if err is not None:      # the output's I/O (disk full): not the tokenizer's fault
            raise err from None
        raise PretokError(f"transformers cannot load this {info.kind} tokenizer: {T._reason(e)}", info.spec) from None
    why = mismatch(loaded, info)
    if why:
        raise PretokError(f"the transformers version of this {info.kind} tokenizer gives other ids than "
                          f"{T.backends_for(info)[-1]}: {why}", info.spec)
