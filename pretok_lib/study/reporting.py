"""What `pretok study` writes around the notebooks it runs: the study record `study.json` (read, written after
each notebook), and the report of the executed notebooks (one combined notebook exported as `report.html` and
`report_nocode.html`, the summary lines printed at the end, the figures it wrote). Executing them is run.py's."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

TITLES = {"01_pretokenize": "1. Pretokenize: formats, sizes, tokenization cost",
          "02_loader_benchmark": "2. Loader-only throughput of the five data paths",
          "03_train": "3. One training run", "04_sweep": "4. The sweep",
          "05_analysis": "5. Analysis: is the data path the bottleneck?"}


def read_record(out_dir: Path) -> dict | None:
    """The study record `out_dir/study.json` (None: none, or unreadable)."""
    try:
        return json.loads((out_dir / "study.json").read_text())
    except (OSError, ValueError):
        return None


def _ended(r: dict) -> dict:
    """A kept notebook's record; `running` there means the study that ran it was killed before recording its end."""
    if r.get("status") != "running":
        return r
    return {**r, "status": "stopped", "error": "the study running it ended without a word (killed?)"}


def write_record(out_dir: Path, record: dict) -> None:
    """`out_dir/study.json`, atomically (a full disk leaves the previous record, not a torn one)."""
    from ..atomic import atomic_write_text

    atomic_write_text(out_dir / "study.json", json.dumps(record, indent=2, default=str) + "\n")


def remove_report(out_dir: Path) -> None:
    """The study's HTML reports and their combined notebook (about to describe notebooks that are rerun)."""
    for p in (out_dir / "report.html", out_dir / "report_nocode.html", out_dir / "notebooks" / "report.ipynb"):
        p.unlink(missing_ok=True)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def combined_notebook(out_dir: Path, names: Sequence[str], record: dict):
    """The executed notebooks as one: a title, the findings in numbers (`findings.findings_cell`), the table of
    contents, then each notebook under an anchored heading, long printouts folded (`present.fold_outputs`).
    plotly.js, which each notebook embeds once, is kept only the first time."""
    import nbformat

    from .findings import findings_cell
    from .present import fold_outputs

    toc = "\n".join(f"- [{TITLES.get(n, n)}](#{n})" + _timing(record, n) for n in names)
    head = f"# pretok study: is the data path the bottleneck?\n\nProfile **{record['profile']}**, {ran(record, names)}"
    where = (f"Study directory `{out_dir}`: figures in `figures/` (HTML + PNG), training runs in `runs/`, benchmark "
             f"JSON in `bench/`, executed notebooks in `notebooks/`.\n\n{toc}")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(head),
                                         nbformat.v4.new_markdown_cell(findings_cell(out_dir, record)),
                                         nbformat.v4.new_markdown_cell(where)])
    seen_plotlyjs = False
    for n in names:
        src = nbformat.read(str(out_dir / "notebooks" / f"{n}.ipynb"), as_version=4)
        nb.metadata = nb.metadata or src.metadata
        nb.cells.append(nbformat.v4.new_markdown_cell(f'<a id="{n}"></a>\n\n---'))
        for cell in src.cells:
            if cell.cell_type == "code" and "injected-parameters" in cell.metadata.get("tags", []):
                continue
            if cell.cell_type == "code":
                keep = []
                for o in cell.get("outputs", []):
                    html = (o.get("data") or {}).get("text/html", "")
                    html = "".join(html) if isinstance(html, list) else html
                    if "plotly.js v" in html and "<div" not in html[:200] and len(html) > 100_000:
                        if seen_plotlyjs:
                            continue
                        seen_plotlyjs = True
                    keep.append(o)
                cell.outputs = fold_outputs(keep)
            nb.cells.append(cell)
    return nb


def _timing(record: dict, name: str) -> str:
    r = record["notebooks"].get(name, {})
    return f" ({r['seconds']:.0f} s)" if r.get("status") == "completed" else f" (**{r['status']}**)" if r else ""


def ran(record: dict, names: Sequence[str]) -> str:
    """When the notebooks `names` ran (a sentence): the first `pretok study` command, the reruns since, and the
    notebooks that ran before an earlier notebook was rerun (their results may not follow it)."""
    runs = {n: record["notebooks"].get(n, {}).get("run") or "" for n in names}
    times = sorted(set(runs.values()) - {""}) or [record.get("started", "")]
    secs = sum(record["notebooks"].get(n, {}).get("seconds", 0) for n in names)
    text = f"run {times[0]} ({secs:.0f} s)"
    for t in times[1:]:
        text += f"; {', '.join(n for n in names if runs[n] == t)} rerun {t}"
    stale = [m for i, m in enumerate(names) if runs[m] and any(runs[n] > runs[m] for n in names[:i])]
    return text + "." + (f" **{', '.join(stale)} ran before an earlier notebook was rerun**: rerun "
                         f"{'them' if len(stale) > 1 else 'it'} to bring the results up to date." if stale else "")


def write_report(out_dir: Path, names: Sequence[str], record: dict) -> dict[str, Path]:
    """`report.html` (code and outputs) and `report_nocode.html` (outputs only) of the executed notebooks."""
    import nbformat

    from ..analysis.report import export_report

    if not names:
        return {}
    nb = combined_notebook(out_dir, names, record)
    path = out_dir / "notebooks" / "report.ipynb"
    nbformat.write(nb, str(path))
    return export_report(path, out_dir, "report")


def summary(out_dir: Path, record: dict) -> str:
    """Where everything is, and how long each notebook took."""
    lines = [f"pretok study ({record['profile']}) in {record.get('seconds', 0):.0f} s: {out_dir}"]
    for n, r in record["notebooks"].items():
        lines.append(f"  {n:22s} {r['status']}" + (f" in {r['seconds']:.0f} s" if "seconds" in r else
                                                   f": {r.get('error')}")
                     + (f" (run {r['run']})" if r.get("run", record.get("started")) != record.get("started") else ""))
    if len({r.get("run") for r in record["notebooks"].values()}) > 1:
        lines.append(f"  {ran(record, list(record['notebooks']))}")
    rep = record.get("report") or {}
    if rep:
        lines.append(f"report:  {rep.get('report_nocode')}  (with code: {rep.get('report')})")
    figs, counts = out_dir / "figures", record.get("figures") or {}
    if counts:
        lines.append(f"figures: {figs}/ ({counts['html']} HTML, {counts['png']} PNG written by this study)")
    if record.get("published_figures"):
        lines.append(f"         also in {record['published_figures']}/")
    runs = out_dir / "runs"
    if runs.is_dir():
        lines.append(f"runs:    {runs}/ ({sum(1 for d in runs.iterdir() if (d / 'run.json').is_file())} runs)")
    if counts.get("html") and not counts.get("png"):
        lines.append(png_hint(record))
    return "\n".join(lines)


def figure_counts(figs: Path, since: float) -> dict[str, int]:
    """HTML and PNG figures in `figs` written at or after `since` (a time.time()), older ones left out."""
    if not figs.is_dir():
        return {}
    return {ext: sum(1 for p in figs.glob(f"*.{ext}") if p.stat().st_mtime >= since - 1) for ext in ("html", "png")}


def png_hint(record: dict) -> str:
    """One line: why the study wrote no PNG, and how to get them."""
    from ..analysis.report import find_chromium

    rerun = f"pretok study --profile {record['profile']} --out {record['study_dir']} --notebooks 05"
    if not record.get("parameters", {}).get("png", True):
        return "no PNGs: the png parameter is off (--set png=true to write them)"
    try:
        find_chromium()
    except RuntimeError:
        return ("no PNGs: no Chromium found; install it (as root: bash scripts/install_system_deps.sh chromium, or "
                f"apt-get install chromium) or set BROWSER_PATH, then rerun: {rerun}")
    return "no PNGs: Chromium is present but the PNG export wrote none (see the output of notebook 05)"
