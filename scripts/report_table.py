#!/usr/bin/env python3
"""One line per case of bitparity reports (JSON, gzipped or not), for the tables of
bench/RESULTS.md (e.g. from reports/baselines/multigpu_scale_<GPU>.json.gz):

    case | verdict | seconds | peak device bytes (largest rank) | traffic (calls, bytes, summed over ranks)

    scripts/report_table.py REPORT.json[.gz] ...
"""
import gzip
import json
import sys


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def traffic(case):
    return "; ".join(f"{t['collective']} {t['calls']} {t['bytes']}" for t in case.get("communication") or [])


def main(paths):
    if not paths:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    for path in paths:
        for c in load(path)["cases"]:
            seconds = c.get("seconds")
            cells = [c["id"], c["verdict"], "" if seconds is None else f"{seconds:.3f}",
                     str(c.get("peak_device_bytes") or ""), traffic(c)]
            print(" | ".join(cells).rstrip(" |"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
