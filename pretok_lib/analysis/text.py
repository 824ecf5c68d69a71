"""Numbers and rows as plain text: compact values (1.23M, 45.6k) and aligned tables for notebooks and logs."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np


def rows_to_text(rows: list[dict[str, Any]], columns: Iterable[str] | None = None,
                 fmt: Callable[[Any], str] | None = None) -> str:
    """Rows (list of dicts) as an aligned plain-text table, for printing in notebooks and logs."""
    if not rows:
        return "(no rows)"
    cols = list(columns or rows[0].keys())
    f = fmt or format_value
    cells = [cols] + [[f(r.get(c)) for c in cols] for r in rows]
    w = [max(len(row[i]) for row in cells) for i in range(len(cols))]
    lines = ["  ".join(c.ljust(w[i]) for i, c in enumerate(row)) for row in cells]
    return "\n".join([lines[0], "-" * len(lines[0]), *lines[1:]])


def format_value(v: Any) -> str:
    """Compact display of a number (1.23M, 45.6k, 0.123) or anything else; None and NaN as '-', infinities as
    'inf' / '-inf'."""
    if isinstance(v, np.generic):
        v = v.item()
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    a = abs(v)
    if a >= 1e6:
        return f"{v / 1e6:.2f}M"
    if a >= 1e4:
        return f"{v / 1e3:.1f}k"
    if isinstance(v, int) or a >= 100:
        return f"{v:.0f}"
    return f"{v:.3g}"
