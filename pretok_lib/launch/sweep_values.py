"""Values of a sweep as text: command-line values read as YAML (`parse_axis`, `parse_setting`, `parse_value`,
`numbers`) and overrides written back as YAML the trainer parses (`yaml_scalar`)."""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

from ..errors import PretokError
from ..train import strict_yaml


def yaml_scalar(v: Any) -> str:
    """`v` as YAML flow text that parses back to `v` (PyYAML reads `3e-4` as a string; `0.0003` as a float)."""
    if isinstance(v, str):
        try:
            same = yaml.safe_load(v) == v
        except yaml.YAMLError:  # `{a`, `[1,`: not YAML as it stands, so quoted
            same = False
        return v if same else json.dumps(v)
    text = yaml.safe_dump(v, default_flow_style=True, width=1 << 20).strip()
    return text[:-3].strip() if text.endswith("...") else text


_EXPONENT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def numbers(v: Any) -> Any:
    """`v` with the numbers PyYAML leaves as strings (`1e-3`, `10e-4`, `1E-3`: YAML 1.1 wants a dot and a signed
    exponent) as floats, also inside lists and mappings."""
    if isinstance(v, str) and _EXPONENT.fullmatch(v.strip()):
        return float(v)
    if isinstance(v, list):
        return [numbers(x) for x in v]
    if isinstance(v, dict):
        return {k: numbers(x) for k, x in v.items()}
    return v


def parse_value(text: str) -> Any:
    """A command-line value as YAML (`numbers` read as such); text that is not YAML is a one-line error."""
    try:
        return numbers(strict_yaml.load(text))
    except yaml.YAMLError as e:
        raise PretokError(f"'{text}' is not a YAML value ({yaml_problem(e)}); quote it to pass it as text") from None


def yaml_problem(e: Exception) -> str:
    """The first line of a PyYAML error ("while parsing a flow sequence"), without its position block."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def parse_axis(text: str) -> tuple[str, list]:
    """`key=v1,v2,...` (CLI) -> (key, [parsed values]); equal numbers however written make one run id (the grid
    refuses two points of one id)."""
    key, sep, vals = text.partition("=")
    if not sep or not key.strip() or not vals.strip():
        raise PretokError(f"axis '{text}' is not of the form key=v1,v2,...")
    try:
        return key.strip(), [parse_value(v) for v in vals.split(",")]
    except PretokError as e:
        raise PretokError(f"axis '{text}': {e}") from None


def parse_setting(text: str) -> tuple[str, Any]:
    """`key=value` (CLI `--set`) -> (key, one parsed value: commas are part of it, as in `pretok train`)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise PretokError(f"'{text}' is not of the form key=value")
    try:
        return key.strip(), parse_value(value)
    except PretokError as e:
        raise PretokError(f"{key.strip()}: {e}") from None
