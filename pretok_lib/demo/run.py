"""`make demo`: build the embedded default corpus and tokenizer, pretokenize into every format, print the summary."""

from __future__ import annotations

from pathlib import Path

from ..errors import PretokError
from ..pretokenize import FORMATS, TokenizeConfig, format_inspect, inspect, run_tokenize, verify
from .corpus import default_corpus_and_tokenizer


def run_demo(out: Path, max_mb: float = 20.0, vocab_size: int = 8192, workers: int = 2) -> dict:
    """Runs the main job on the embedded default; returns {format: inspect report}. A format whose output fails
    `verify` is an error (PretokError) once every format is done."""
    corpus, tokenizer = default_corpus_and_tokenizer(out / "default", max_mb=max_mb, vocab_size=vocab_size)
    print(f"corpus     {corpus.path}: {corpus.documents:,} documents, {corpus.text_bytes / 1e6:.1f} MB "
          f"from {', '.join(corpus.packages)}")
    print(f"tokenizer  {tokenizer} (byte-level BPE trained on the corpus, vocab {vocab_size})\n")
    reports, failed = {}, []
    for fmt in FORMATS:
        dest = out / fmt
        run_tokenize(TokenizeConfig(inputs=[corpus.path], out=str(dest), tokenizer=str(tokenizer), format=fmt,
                                    workers=workers, command=["pretok", "demo", "--out", str(out)]))
        rep = verify(dest, sample=16)
        reports[fmt] = inspect(dest)
        print(f"== {dest}")
        print(format_inspect(reports[fmt]))
        print(f"verify      {'OK' if rep.ok else 'FAILED'}: checksums of {rep.files_checked} files, "
              f"{rep.ids_equal}/{rep.documents_checked} sampled documents identical to re-tokenized source\n")
        if not rep.ok:
            failed.append(f"{fmt}: {rep.problems[0]}" + (f" (+{len(rep.problems) - 1} more)" if len(rep.problems) > 1
                                                         else ""))
    if failed:
        raise PretokError(f"verify failed for {len(failed)} of {len(FORMATS)} formats: {'; '.join(failed)}", out)
    return reports
