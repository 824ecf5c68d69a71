"""Where a tokenizer keeps its BOS/EOS/PAD tokens: one resolution, an ordered list of sources, the first that
declares a role wins, and which source that was is recorded (`TokenizerInfo.special_sources`, the manifest's
`tokenizer.special_sources`).

Sources, in order (each tokenizer kind offers those it has):
1. `tokenizer_config.json` / `special_tokens_map.json` beside the file (`bos_token` as a string or an AddedToken
   dict `{"content": ...}`; an explicit null means none): what the model's authors wrote for transformers;
2. the tokenizer's own definition: a tokenizer.json TemplateProcessing post-processor (also inside a `Sequence`),
   a SentencePiece model's bos/eos/pad ids, a tekken file's special tokens;
3. special tokens named for the role: tokenizer.json `added_tokens` marked `special`, tiktoken's special tokens,
   matched by name after NFKC and decoration are stripped (`<｜begin▁of▁sentence｜>` -> `begin_of_sentence`);
4. well-known strings present in the vocabulary (`<s>`, `</s>`, `<|endoftext|>`, ...).
"""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Mapping, Sequence

from ..errors import PretokError

if TYPE_CHECKING:
    from .files import TokenizerInfo

ROLES = ("bos", "eos", "pad")
KNOWN = {  # well-known special strings, tried in order when nothing else names the role
    "bos": ("<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>", "<|endoftext|>"),
    "eos": ("<|end_of_text|>", "</s>", "<eos>", "<|endoftext|>"),
    "pad": ("<pad>", "<|pad|>", "[PAD]"),
}
# names a special token carries for its role once normalized (`role_name`)
ROLE_NAMES = {
    "bos": frozenset({"bos", "s", "begin_of_sentence", "beginofsentence", "begin_of_text", "beginoftext",
                      "start_of_text", "startoftext", "bos_token"}),
    "eos": frozenset({"eos", "/s", "end_of_sentence", "endofsentence", "end_of_text", "endoftext", "eos_token"}),
    "pad": frozenset({"pad", "pad_token", "padding"}),
}
CONFIG_FILES = ("special_tokens_map.json", "tokenizer_config.json")  # the later overrides the earlier
WELL_KNOWN = "well-known string"

Source = tuple[str, Mapping[str, "int | None"]]  # (name, {role: id}); a role present with None: declared none


def role_name(token: str) -> str:
    """A special token's name without its decoration: NFKC (fullwidth `｜` -> `|`), lower case, `▁`/space/`-` ->
    `_`, then the brackets, bars and underscores around it stripped: `<｜end▁of▁sentence｜>` -> `end_of_sentence`,
    `<|endoftext|>` -> `endoftext`, `</s>` -> `/s`, `[PAD]` -> `pad`."""
    name = unicodedata.normalize("NFKC", token).lower()
    for ch in ("\u2581", " ", "-"):
        name = name.replace(ch, "_")
    return name.strip("<>[]|_")


def by_name(tokens: Iterable[tuple[str, int]]) -> dict[str, int]:
    """{role: id} of the special tokens whose name is the role's (`ROLE_NAMES`); the first token of a role wins
    (the lowest id when `tokens` are sorted by id)."""
    out: dict[str, int] = {}
    for content, i in tokens:
        name = role_name(content)
        for role in ROLES:
            if role not in out and name in ROLE_NAMES[role]:
                out[role] = i
    return out


def well_known(lookup: Callable[[str], "int | None"]) -> dict[str, int]:
    """{role: id} of the first well-known string of each role that `lookup` finds."""
    out = {}
    for role, known in KNOWN.items():
        found = next((i for s in known if (i := lookup(s)) is not None), None)
        if found is not None:
            out[role] = found
    return out


def resolve(sources: Sequence[Source]) -> tuple[list["int | None"], dict[str, "str | None"]]:
    """([bos, eos, pad] ids, {role: name of the source that decided it, None when no source declares it}): for
    each role the first source declaring it (an explicit None included: a config's null means the tokenizer has
    none, and that config is the source)."""
    ids: list[int | None] = []
    where: dict[str, str | None] = {}
    for role in ROLES:
        where[role], found = next(((name, found[role]) for name, found in sources if role in found), (None, None))
        ids.append(found)
    return ids, where


def config_source(directory: Path, lookup: Callable[[str], "int | None"]) -> list[Source]:
    """The roles `special_tokens_map.json` / `tokenizer_config.json` beside a tokenizer declare, one source
    each, tokenizer_config.json first (it overrides). A token string that is not in the vocabulary gives None."""
    out: list[Source] = []
    for name in reversed(CONFIG_FILES):
        path = directory / name
        if not path.is_file():
            continue
        try:
            data = path.read_bytes()
        except OSError as e:
            raise PretokError(f"cannot read tokenizer file: {e.strerror or e}", path) from None
        try:
            obj = json.loads(data)
        except (ValueError, UnicodeDecodeError) as e:
            raise PretokError(f"corrupt or truncated JSON: {e}", path) from None
        obj = obj if isinstance(obj, dict) else {}
        found: dict[str, int | None] = {}
        for role in ROLES:
            if f"{role}_token" not in obj:
                continue
            tok = obj[f"{role}_token"]
            if not (tok is None or isinstance(tok, str) or isinstance(tok, dict)
                    and isinstance(tok.get("content"), (str, type(None)))):
                raise PretokError(f"{role}_token must be a string, null or {{\"content\": string}} "
                                  f"(got {json.dumps(tok)[:60]})", path)
            tok = tok.get("content") if isinstance(tok, dict) else tok
            found[role] = lookup(tok) if tok else None
        out.append((name, found))
    return out


def hub_config_source(tok: object) -> list[Source]:
    """The roles a transformers tokenizer loaded from the hub names (its config's explicit nulls are not visible)."""
    found = {r: getattr(tok, f"{r}_token") for r in ROLES if getattr(tok, f"{r}_token", None)}
    vocab = tok.get_vocab()  # type: ignore[attr-defined]
    return [("tokenizer_config.json", {r: vocab.get(str(t)) for r, t in found.items()})]


def transformers_added_source(tok: object) -> Source:
    """Special added tokens of a transformers tokenizer named for a role (`by_name`)."""
    decoder = getattr(tok, "added_tokens_decoder", None) or {}
    return ("added_tokens", by_name((str(decoder[i]), i) for i in sorted(decoder)
                                    if getattr(decoder[i], "special", False)))


def template_roles(pp: object, path: Path) -> dict[str, int]:
    """bos/eos ids a HF TemplateProcessing post-processor puts before/after a single sequence; one inside a
    `Sequence` post-processor (Llama 3, DeepSeek: ByteLevel then TemplateProcessing) is found too."""
    if isinstance(pp, dict) and pp.get("type") == "Sequence" and isinstance(pp.get("processors"), list):
        for inner in pp["processors"]:
            if found := template_roles(inner, path):
                return found
        return {}
    if not isinstance(pp, dict) or pp.get("type") != "TemplateProcessing":
        return {}
    try:
        items = pp.get("single", [])
        seq = next((i for i, item in enumerate(items) if "Sequence" in item), 0)
        ids = [pp["special_tokens"][item["SpecialToken"]["id"]]["ids"][0] for item in items if "SpecialToken" in item]
        if not all(type(i) is int for i in ids):
            raise ValueError("a special token id is not an integer")
    except (KeyError, IndexError, TypeError, ValueError) as e:
        raise PretokError(f"not a valid HF tokenizer.json: its TemplateProcessing post_processor: {e!r}", path) from None
    before = sum("SpecialToken" in item for item in items[:seq])
    return {**({"bos": ids[0]} if before else {}), **({"eos": ids[-1]} if len(ids) > before else {})}


def added_special_tokens(obj: dict) -> list[tuple[str, int]]:
    """(content, id) of a tokenizer.json's added tokens marked special, by id (malformed entries skipped:
    `json_vocab` has validated what the vocabulary needs)."""
    tokens = obj.get("added_tokens")
    found = [(t["content"], t["id"]) for t in tokens or [] if isinstance(t, dict) and t.get("special")
             and isinstance(t.get("content"), str) and type(t.get("id")) is int] if isinstance(tokens, list) else []
    return sorted(found, key=lambda t: t[1])


def policy_id(info: "TokenizerInfo", role: str, flag: str) -> int | None:
    """The id written for `role` ("bos", "eos") under `--bos/--eos` `flag`: "no" none, "auto" the tokenizer's
    (None if it has none), "yes" the tokenizer's or a PretokError. The on-the-fly baselines use it too."""
    if flag not in ("auto", "yes", "no"):
        raise PretokError(f"--{role} '{flag}' is not one of auto, yes, no")
    tok_id = getattr(info, f"{role}_id")
    if flag == "no":
        return None
    if tok_id is None and flag == "yes":
        raise PretokError(f"--{role} yes, but tokenizer {info.spec} defines no {role.upper()} token")
    return tok_id
