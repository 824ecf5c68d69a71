"""Pick the fastest backend whose ids equal the reference implementation's on sample texts and hard probes."""

from __future__ import annotations

import functools
import itertools
import unicodedata
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

import numpy as np

from ..errors import PretokError
from .backends import BackendUnavailable, _reason, backends_for, make_encoder, unbuildable
from .files import TokenizerInfo

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


# Characters whose class (white space, letter, number, other) regex engines' Unicode tables may disagree on: U+180E
# is white space to fastokens on tiktoken's patterns but not to tiktoken (a " \u180e" before a letter or digit, or a
# "\u180e'll", gave other ids), so a .tiktoken corpus holding one was silently encoded unlike the reference.
_VOLATILE_CATEGORIES = ("Zs", "Zl", "Zp", "Cc", "Cf", "Mn", "Mc", "Me", "Nd", "Nl", "No")


@functools.lru_cache(maxsize=1)
def unicode_probes() -> tuple[str, ...]:
    """Every code point of the categories above (and any Python calls a space), plus the first letter or symbol of
    each 256-code-point block (scripts newer than an engine's tables), each after a space, before a contraction
    and before a digit; 32 code points a text (~70 KB in all)."""
    cps = []
    blocks = set()
    for c in itertools.chain(range(0xD800), range(0xE000, 0x40000), range(0xE0000, 0xE1000)):  # the rest: unassigned
        ch, cat = chr(c), unicodedata.category(chr(c))
        if cat in _VOLATILE_CATEGORIES or ch.isspace():
            cps.append(ch)
        elif cat[0] in "LS" and c >> 8 not in blocks:
            blocks.add(c >> 8)
            cps.append(ch)
    return tuple("".join(f" {ch}x{ch}'ll {ch}1" for ch in cps[i:i + 32]) for i in range(0, len(cps), 32))


def probe_texts(special_tokens: Sequence[str]) -> list[str]:
    """Built-in hard cases, characters engines may class differently, and every special-token string embedded in
    ordinary text."""
    specials = [s for s in special_tokens if s]
    embedded = [f"a{s}b {s} x{s}{s}\n{s}" for s in specials]
    return [*_PROBES, *unicode_probes(), *embedded, " ".join(specials),
            "Hello " + "\n\n".join(specials[:50]) + " world"]


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
