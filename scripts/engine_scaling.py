"""The engine's scaling curve from `pretok bench tokenize --workers N --json F` runs (issue 39, part 3).

usage: python scripts/engine_scaling.py runs/gpu/tokenize-w*.json [--json OUT]
"""

import argparse
import json

from pretok_lib.bench.scaling_curve import main

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("jsons", nargs="+")
    ap.add_argument("--json", help="write the curve here")
    a = ap.parse_args()
    curve = main(a.jsons)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(curve, fh, indent=1)
