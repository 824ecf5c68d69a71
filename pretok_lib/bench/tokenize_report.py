"""What `pretok bench tokenize` reports: method names, rates, the side-by-side table and the targets."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

from ..analysis.uncertainty import check_ceilings, check_isolated_speedup
from ..machine.probe import machine_line
from . import fmt_num
from .repeats import probes_of, ratio_estimate, sample_estimates, text, threshold_resolved

LOOP, MAP, CEIL = "(a) per-doc tok(text) loop", "(b) datasets.map", "(c) ceiling 1 core"


def phase_name(name: str) -> str:
    """The key, in a round, of an engine method's tokenizing-phase seconds (start-up and finish excluded)."""
    return f"{name} tokenizing phase"


def ceil_name(n: int) -> str:
    """The method name of the in-memory ceiling on n cores."""
    return CEIL if n == 1 else f"(c) ceiling {n} cores"

def fastest(runs: list[dict]) -> dict:
    """The fastest of repeated runs, with every run's seconds (`all_seconds`)."""
    best = dict(min(runs, key=lambda r: r["seconds"]))
    best["all_seconds"] = [round(r["seconds"], 3) for r in runs]
    return best


def rates(r: dict, text_bytes: int) -> dict:
    """Add MB measured, docs/s, tokens/s, MB/s and bytes/token to one method's raw result."""
    s = r["seconds"]
    r.update(mb=text_bytes / 1e6, docs_per_s=r["documents"] / s, tokens_per_s=r["tokens"] / s,
             mb_per_s=text_bytes / 1e6 / s)
    if r.get("stored_tokens"):
        r["bytes_per_token"] = r["disk_bytes"] / r["stored_tokens"]
    return r


_num = fmt_num


def _cores(name: str) -> int:
    """How many cores a method uses: K for "(d) engine ... wK", n for "(c) ceiling n cores", else 1."""
    if name.startswith("(d)"):
        return int(name.rsplit("w", 1)[1])
    if name.startswith("(c) ceiling") and name.endswith("cores"):
        return int(name.split()[2])
    return 1


def table(methods: dict[str, dict], ref_b: float | None) -> str:
    """Aligned plain-text table of every method; "x ceiling" is against the ceiling on as many cores."""
    rows = [["method", "MB measured", "docs/s", "tokens/s", "MB/s", "peak RSS MB", "bytes/token", "x (b)",
             "x ceiling", "ids = engine"]]
    for name, r in methods.items():
        ceil = methods.get(ceil_name(_cores(name)))
        rows.append([name, _num(r["mb"]), _num(r["docs_per_s"], True), _num(r["tokens_per_s"], True),
                     _num(r["mb_per_s"]), _num(r.get("peak_rss_mb")), _num(r.get("bytes_per_token")),
                     _num(r["mb_per_s"] / ref_b if ref_b else None),
                     _num(r["mb_per_s"] / ceil["mb_per_s"] if ceil else None),
                     {True: "yes", False: "NO", None: "-"}[r.get("ids_identical")]])
    w = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w[i]) if i == 0 else c.rjust(w[i]) for i, c in enumerate(row)) for row in rows]
    return "\n".join([lines[0], "-" * len(lines[0]), *lines[1:]])


def paired_ratio(rounds: list[dict[str, float]], slow: str, fast: str) -> float | None:
    """Median over rounds of seconds[slow] / seconds[fast] (= the MB/s ratio fast / slow) within each round."""
    vals = [r[slow] / r[fast] for r in rounds if r.get(slow) and r.get(fast)]
    return statistics.median(vals) if vals else None


def targets(methods: dict[str, dict], n: int, scan: list[dict], rounds: list[dict[str, float]] = (),
            bounds: Mapping[str, Mapping] | None = None) -> list[dict]:
    """The targets, each with its value, threshold and pass/fail/None. Ratios of
    the engine and the ceilings are the median of their ratios within each round (runs minutes apart on a shared
    machine see different speeds); without rounds, of the fastest runs. `bounds`: each format's stage bound
    (`bench.stages`), reported beside its wN / ceiling with the share of it reached."""
    out: list[dict] = []

    def add(name: str, value: float | None, need: float | None, op: str = ">=", note: str = "") -> None:
        ok = None if value is None or need is None else (value >= need if op == ">=" else value <= need)
        out.append({"target": name, "value": value, "need": "n/a" if need is None else f"{op} {need:.3g}",
                    "pass": ok, "note": note})

    def mbs(name: str) -> float | None:
        return methods[name]["mb_per_s"] if name in methods else None

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a and b else None

    def rate_ratio(fast: str, slow: str) -> float | None:
        """MB/s of `fast` over MB/s of `slow` (method names), paired by round when there are rounds."""
        return paired_ratio(list(rounds), slow, fast) if rounds else ratio(mbs(fast), mbs(slow))

    en, e1 = f"(d) engine memmap w{n}", "(d) engine memmap w1"
    # the target: the engine end to end at >= half the backend's in-memory rate on one thread; per-core
    # efficiency against the ceiling on as many cores is reported, not a target
    add(f"engine memmap w{n} / in-memory ceiling (1 thread)", rate_ratio(en, CEIL), 0.5)
    # the engine end to end near the machine's own ceiling on as many cores: >= 0.8x on 1 core (memmap), >= 0.7x
    # on n cores for every format (memmap paired by round; the other formats' fastest runs against the fastest
    # ceiling, as they run after the rounds)
    add("engine memmap w1 / in-memory ceiling on 1 core", rate_ratio(e1, CEIL), 0.8,
        note=bound_note((bounds or {}).get("memmap")))
    if n > 1:
        for name in (k for k in methods if k.startswith("(d) engine ") and k.endswith(f" w{n}")):
            fmt = name.split()[2]
            value = rate_ratio(name, ceil_name(n)) if fmt == "memmap" else ratio(mbs(name), mbs(ceil_name(n)))
            add(f"engine {fmt} w{n} / in-memory ceiling on {n} cores, measured", value, 0.7,
                note=bound_note((bounds or {}).get(fmt)))
            if (bounds or {}).get(fmt):
                add(f"engine {fmt} w{n} / its stage bound (share of what any engine could reach)",
                    ratio(value, bounds[fmt]["bound"]["median"]), None)
    # start-up: process start to the first batch tokenized, in the fastest run of each engine method
    starts = [(methods[k].get("timeline") or {}).get("startup_seconds") for k in methods if k.startswith("(d) ")]
    starts = [x for x in starts if x is not None]
    add("engine start-up s (to the first batch tokenized), slowest engine method", max(starts) if starts else None,
        0.3, "<=", note="(issue 17's goal, out of reach while building the encoder takes 0.2-0.3 s of it; issue 37's "
        "is <= 1 s)")
    add(f"engine memmap w{n} / (b) datasets.map num_proc={n}", ratio(mbs(en), mbs(MAP)), 15)
    same = methods[MAP]["ids_identical"] if MAP in methods else None
    add("(b) ids identical to engine memmap (1 = yes)", None if same is None else float(same), 1)
    if n > 1:
        # The ceilings time encoding only (their encoder is built before the clock starts), so their 1 -> n gain is
        # a steady-state one; the engine is held to it on its steady state too: the tokenizing phase, from the first
        # batch to the last part appended (reading, tokenizing, writing, hashing and appending all included). Its
        # start-up (mostly building the encoder, ~1 s whatever the worker count) is in the end-to-end speedup.
        allows = rate_ratio(ceil_name(n), CEIL)  # what the machine itself gives from 1 to n cores, in memory
        need = None if allows is None else 0.8 * min(n, allows)
        p1, pn = phase_name(e1), phase_name(en)
        tok_s = [(methods.get(k) or {}).get("timeline", {}).get("tokenize_seconds") for k in (e1, en)]
        steady = paired_ratio(list(rounds), p1, pn) if rounds else ratio(*tok_s)
        each = [f"{r[p1] / r[pn]:.2f}/{r[CEIL] / r[ceil_name(n)]:.2f}" for r in rounds
                if all(r.get(k) for k in (p1, pn, CEIL, ceil_name(n)))]
        add(f"engine memmap speedup w1 -> w{n}, steady state", steady, need,
            note="" if allows is None else f"(0.8 x the ceiling's own {allows:.2f}x from 1 to {n} cores"
            + (f"; engine/ceiling by round: {', '.join(each)})" if each else ")"))
        add(f"engine memmap speedup w1 -> w{n}, end to end (with the start-up)", rate_ratio(en, e1), None)
    rss = [r["peak_rss_mb"] for k, r in methods.items() if k.startswith("(d)")] + [s["peak_rss_mb"] for s in scan]
    add("engine worker peak RSS MB, all runs", max(rss) if rss else None, 400, "<=")
    if len(scan) > 2:
        # Flat = no growth with the input once the worker's bounded caches are full (the encoder's internal caches
        # and the allocators' retained memory fill over the first few hundred MB): the largest input against one
        # at most a quarter of its size. The rise from the smallest input, while they fill, is reported as well.
        big = scan[-1]
        mid = max((s for s in scan[:-1] if 4 * s["mb"] <= big["mb"]), key=lambda s: s["mb"], default=scan[-2])
        add(f"worker peak RSS {big['mb']:g} MB / {mid['mb']:g} MB input (flat once caches are full)",
            ratio(big["peak_rss_mb"], mid["peak_rss_mb"]), 1.1, "<=")
        add(f"worker peak RSS {big['mb']:g} MB / {scan[0]['mb']:g} MB input (caches filling)",
            ratio(big["peak_rss_mb"], scan[0]["peak_rss_mb"]), None)
    return out


def bound_note(b: Mapping | None) -> str:
    """A format's stage bound beside a target against the ceiling: what no engine passes on this input."""
    if not b:
        return ""
    lo, hi = b["bound"]["interval"]
    return f"(stage bound {b['bound']['median']:.2f} [{lo:.2f}, {hi:.2f}]: no engine passes it on this input)"


def _paired(rounds: Sequence[Mapping[str, float]], slow: str, fast: str) -> dict | None:
    """seconds[slow] / seconds[fast] within each round (= fast's rate over slow's), with its interval."""
    pairs = [(r[slow], r[fast]) for r in rounds if r.get(slow) and r.get(fast)]
    return ratio_estimate([a for a, _ in pairs], [b for _, b in pairs])


def add_intervals(tg: list[dict], rounds: Sequence[Mapping[str, float]], n: int) -> None:
    """Give each target paired by round its interval, n and `resolved` (the interval wholly on one side of the
    threshold; False: the noise decides pass or fail, so the pass is not a finding)."""
    en, e1 = f"(d) engine memmap w{n}", "(d) engine memmap w1"
    pairs = {f"engine memmap w{n} / in-memory ceiling (1 thread)": (CEIL, en),
             "engine memmap w1 / in-memory ceiling on 1 core": (CEIL, e1),
             f"engine memmap w{n} / in-memory ceiling on {n} cores, measured": (ceil_name(n), en),
             f"engine memmap speedup w1 -> w{n}, steady state": (phase_name(e1), phase_name(en)),
             f"engine memmap speedup w1 -> w{n}, end to end (with the start-up)": (e1, en)}
    for t in tg:
        if t["target"] not in pairs or not rounds:
            continue
        e = _paired(rounds, *pairs[t["target"]])
        t["estimate"] = e
        t["interval"], t["n"] = (e["interval"], e["n"]) if e else (None, 0)
        parts = str(t["need"]).split()
        if e and len(parts) == 2 and parts[1] != "n/a":
            t["resolved"] = threshold_resolved(e, float(parts[1]))
        else:
            t["resolved"] = None


def repeat_summary(runs: Mapping[str, Sequence[Mapping]], rounds: Sequence[Mapping[str, float]], cinfo: Mapping,
                   n: int) -> dict:
    """The repeated rounds as estimates: MB/s per method (median, interval, n), the ratios from paired rounds
    (isolated tokenization speedup: the engine against the per-document loop; engine and ceilings 1 -> n), the
    machine over every probed run, and the measurements that cannot be true ("invalid")."""
    def mbps(name: str) -> list[float | None]:
        size = cinfo["prefix_bytes"] if name == LOOP else cinfo["text_bytes"]
        return [size / 1e6 / r[name] if r.get(name) else None for r in rounds]

    names = list(dict.fromkeys(k for r in rounds for k in r if not k.endswith("tokenizing phase")))
    en, e1 = f"(d) engine memmap w{n}", "(d) engine memmap w1"
    ratios = {f"isolated tokenization speedup: {en} / {LOOP}": ratio_estimate(mbps(en), mbps(LOOP)),
              f"{en} / {e1} (end to end)": ratio_estimate(mbps(en), mbps(e1)),
              f"{ceil_name(n)} / {CEIL}": ratio_estimate(mbps(ceil_name(n)), mbps(CEIL))}
    ratios = {k: v for k, v in ratios.items() if v}
    est = sample_estimates({k: mbps(k) for k in names})
    invalid = []
    # every ceiling measured, by its core count: one on more cores below one on fewer cannot be true
    ceil = {_cores(k): e for k, e in est.items() if k.startswith("(c) ceiling") and e}
    if len(ceil) > 1:
        ids = [f"{ceil_name(k)} x{len(runs.get(ceil_name(k), []))}" for k in sorted(ceil)]
        why = check_ceilings({k: v["median"] for k, v in ceil.items()}, ids)
        invalid += [why] if why else []
    iso = ratios.get(f"isolated tokenization speedup: {en} / {LOOP}")
    why = check_isolated_speedup(iso["median"] if iso else None, [f"{en} and {LOOP}, {len(rounds)} rounds"])
    invalid += [why] if why else []
    return {"rounds": len(rounds), "mb_per_s": est, "ratios": ratios, "invalid": invalid, "machine": probes_of(runs)}


def print_repeats(rep: Mapping) -> None:
    """The rounds' medians and intervals, the paired ratios (marked "not resolved" when they hold 1), whether the
    machine was quiet, and the invalid measurements."""
    print(f"\nover {rep['rounds']} interleaved rounds (median [interval] n; MB/s):")
    for name, e in rep["mb_per_s"].items():
        print(f"  {name}: {text(e)}")
    for name, e in rep["ratios"].items():
        print(f"  {name}: {text(e)}")
    print(machine_line(rep["machine"]))
    for why in rep["invalid"]:
        print(f"  invalid measurement: {why}")
