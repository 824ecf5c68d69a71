"""Pack what `pretok gpu-study` needs on a GPU machine without network (docs/GPU_CHECK.md, "The study on a GPU").

Writes one tar.gz of the corpus and the tokenizers, made from ../shared/data:
- corpus.jsonl: the Wikipedia summaries (en, fr) and the Python docs, one {"id", "text"} per document (20,485 of
  them, 21 MB);
- tekken_240718.json (the study's 131k tokenizer);
- gpt2/tokenizer.json (the engine part's).
With --wheels DIR it also downloads the cp312 manylinux wheels of the packages the lent H200's image lacks (WHEELS,
versions as installed here) with pip.

usage: python scripts/gpu_study_pack.py [--shared ../shared/data] [--out .devdata/data.tar.gz] [--wheels .whl]
then, on the machine: tar -xzf data.tar.gz -C /tmp/dd; pip install --no-index --no-deps --target /tmp/site .whl/*.whl
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WHEELS = ("fastokens", "zstandard", "plotly", "mistral-common", "pydantic", "pydantic-core", "annotated-types",
          "typing-inspection", "pydantic-extra-types", "pycountry", "jsonschema", "jsonschema-specifications",
          "referencing", "rpds-py")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


def corpus_lines(shared: Path) -> list[str]:
    """The corpus as JSON lines: every non-empty Wikipedia summary (en, fr), then every Python docs page."""
    lines = []
    for name in ("summaries_en-us.json", "summaries_fr-fr.json"):
        for key, v in json.loads((shared / "corpora/wikipedia-vital-summaries" / name).read_text()).items():
            if (v.get("extract") or "").strip():
                lines.append(json.dumps({"id": key, "text": v["extract"]}))
    for line in (shared / "corpora/python-docs/python-3.11-docs-rst.jsonl").read_text().splitlines():
        doc = json.loads(line)
        lines.append(json.dumps({"id": doc["id"], "text": doc["text"]}))
    return lines


def pack(shared: Path, out: Path) -> dict:
    """Write the tar.gz (to a temp name, renamed last); returns what it holds."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    lines = corpus_lines(shared)
    with tarfile.open(tmp, "w:gz") as tar:
        data = ("\n".join(lines) + "\n").encode()
        info = tarfile.TarInfo("corpus.jsonl")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        tar.add(shared / "tokenizers/mistral/tekken_240718.json", "tekken_240718.json")
        tar.add(shared / "tokenizers/gpt2/tokenizer.json", "gpt2/tokenizer.json")
    tmp.replace(out)
    return {"out": str(out), "documents": len(lines), "bytes": out.stat().st_size}


def download_wheels(dest: Path) -> None:
    """pip download the WHEELS, at the versions installed here, for CPython 3.12 on x86-64 Linux."""
    pins = [f"{name}=={md.version(name)}" for name in WHEELS]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
           "3.12", "--implementation", "cp", *(a for p in PLATFORMS for a in ("--platform", p)), "-d", str(dest), *pins]
    subprocess.run(cmd, check=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shared", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--out", default=str(ROOT / ".devdata" / "data.tar.gz"))
    ap.add_argument("--wheels", default=None, help="also download the wheels into this folder")
    a = ap.parse_args()
    print(json.dumps(pack(Path(a.shared), Path(a.out))))
    if a.wheels:
        download_wheels(Path(a.wheels))


if __name__ == "__main__":
    main()
