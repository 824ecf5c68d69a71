"""Benchmarks: each prints a table with ratios measured side by side in one run and writes --json."""


def fmt_num(v: float | None, rate: bool = False) -> str:
    """A table cell: rates as 1.23M / 45.6k, other numbers with 3 significant-ish digits, None as '-'."""
    if v is None:
        return "-"
    if rate:
        return f"{v / 1e6:.2f}M" if v >= 1e6 else f"{v / 1e3:.1f}k" if v >= 1e4 else f"{v:.0f}"
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}" if v >= 0.1 else f"{v:.3f}"
