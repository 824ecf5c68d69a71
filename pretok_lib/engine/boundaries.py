"""What an output says about the boundaries of its documents, and the warnings a finished run prints about them.

- `document_boundaries`: the manifest's `boundaries` (docs/FORMATS.md): the token(s) between packed documents
  (`separator`: "bos", "eos", "bos+eos", null; "row" for padded, one document a row) and, for padded, the share of
  tokens the rows cut off (`truncated_fraction`).
- `boundary_warnings`: one line each for a packed output whose documents run together (no BOS, no EOS) and for a
  padded output that lost most of its tokens to truncation; exit 0 stays (the data is what was asked for).
- `empty_shards`: the shards of a `--num-shards` run that get no unit (a small input), named in one line.
"""

from __future__ import annotations

from ..sources import Unit, shard_units

PACKED = ("memmap", "token-list")  # formats whose readers join documents into one token stream
TRUNCATION_WARN = 0.5  # a padded output that cut more than this share of its tokens warns


def separator(fmt: str, bos_id: int | None, eos_id: int | None) -> str | None:
    """What lies between two documents of the output: "row" (padded), else "bos", "eos", "bos+eos" or None."""
    if fmt not in PACKED:
        return "row"
    return "+".join(name for name, i in (("bos", bos_id), ("eos", eos_id)) if i is not None) or None


def document_boundaries(fmt: str, policy: dict, counts: dict) -> dict:
    """The manifest's `boundaries`: `separator`, and for padded `truncated_fraction` (of kept + cut tokens)."""
    out: dict = {"separator": separator(fmt, policy.get("bos_id"), policy.get("eos_id"))}
    if fmt not in PACKED:
        cut, kept = counts.get("truncated", 0), counts.get("tokens", 0)
        out["truncated_fraction"] = round(cut / (cut + kept), 6) if cut + kept else 0.0
    return out


def boundary_warnings(out: str, manifest: dict) -> list[str]:
    """The one-line warnings of a finished output (empty when its documents are separated and kept)."""
    fmt, b, counts, tok = manifest["format"], manifest["boundaries"], manifest["counts"], manifest["tokenizer"]
    lines = []
    if fmt in PACKED and b["separator"] is None and counts["documents"] > 1:
        has = [f"--{r} yes" for r in ("eos", "bos") if tok.get(f"{r}_id") is not None]
        fix = (f"pass {' or '.join(has)}" if has else "the tokenizer defines neither BOS nor EOS: name one "
               "(eos_token/bos_token) in a tokenizer_config.json beside it")
        lines.append(f"pretok: warning: {out}: {fmt} documents are packed with no separator (no BOS, no EOS "
                     f"between them), so a model cannot tell where one ends; {fix}")
    share = b.get("truncated_fraction", 0.0)
    if share > TRUNCATION_WARN:
        cut = counts["truncated"]
        lines.append(f"pretok: warning: {out}: padded rows cut off {cut:,} of {cut + counts['tokens']:,} tokens "
                     f"({share:.2%}) at --seq-len {manifest['policy'].get('seq_len')}: most of the text is lost; "
                     "split the text into shorter documents (--separator for .txt inputs), or use a packed format "
                     "(--format memmap or token-list)")
    return lines


def empty_shards(units: list[Unit], num_shards: int) -> list[int]:
    """Indices of the shards that `shard_units` gives no unit (more shards than units)."""
    return [i for i in range(num_shards) if not shard_units(units, num_shards, i)] if num_shards > 1 else []


def empty_shards_warning(out: str, units: list[Unit], num_shards: int) -> str | None:
    """One line naming the empty shards of this sharding, or None when every shard has a unit."""
    empty = empty_shards(units, num_shards)
    if not empty:
        return None
    return (f"pretok: warning: {out}: the input has {len(units)} unit(s) for {num_shards} shards, so shard(s) "
            f"{', '.join(map(str, empty))} of {num_shards} are empty (valid outputs of 0 documents); use "
            f"--num-shards {len(units)}{'' if len(units) == 1 else ' or fewer'}, or a smaller --part-mb")
