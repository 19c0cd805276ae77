#!/usr/bin/python3
"""Writes the "Lanes" section of docs/PERFORMANCE_MULTIHOST.md from one run of
scripts/bench_lanes.sh: strata with one connection per peer (STRATA_UCX_LANES=1) against its
default striping, per collective, layout and size, the median over the rounds of each round's
time (each the median of its repeats, the slowest rank's).

    /usr/bin/python3 scripts/perf_lanes_report.py build/bench-lanes [--docs docs] [--command CMD]
"""
import argparse
import glob
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report_common import ft, human, md_table, read_json, replace_section  # noqa: E402

BEGIN = "<!-- lanes:begin -->"
END = "<!-- lanes:end -->"
STRIPE_MIN = 512 << 10  # STRATA_UCX_STRIPE_MIN's default
COLL_ORDER = ("all_reduce", "all_to_all", "all_gather", "reduce_scatter", "broadcast")


def load(out):
    """{(variant, coll, ranks per host): {size: [time_us per round]}}."""
    runs = {}
    for path in sorted(glob.glob(os.path.join(out, "lanes-*", "r*", "strata_*_p*_r1.json"))):
        m = re.search(r"lanes-([^/]+)/r\d+/strata_(.+)_p(\d+)_r1\.json$", path)
        doc = read_json(path, {}, "perf_lanes_report")
        if not m or not doc:
            continue
        key = (m.group(1), m.group(2), int(m.group(3)))
        for row in doc.get("results", []):
            runs.setdefault(key, {}).setdefault(int(row["size"]), []).append(float(row["time_us"]))
    return runs


def largest_message(coll, size, per_host, hosts=2):
    """The largest data message one rank sends across hosts in a call of `size` bytes (the whole
    buffer, as the bench counts it), by the patterns of src/coll/net/: hierarchical for every
    collective but all_to_all when hosts hold several ranks, direct otherwise."""
    n = hosts * per_host
    if coll == "broadcast":
        return size // per_host  # the root's host sends one block per local rank
    if coll == "all_reduce" and per_host > 1:
        return size // per_host // hosts  # rail reduce-scatter/all-gather of the host slice
    return size // n  # one block per peer


def lines(runs, command):
    layouts = sorted({k[2] for k in runs}, reverse=True)
    colls = [c for c in COLL_ORDER if any(k[1] == c for k in runs)]
    rounds = max((len(v) for d in runs.values() for v in d.values()), default=0)
    L = [BEGIN, "## Lanes: striped bulk transfers against one connection", "",
         "Data messages of at least `STRATA_UCX_STRIPE_MIN` (512 KiB) travel in pieces of "
         "`STRATA_UCX_STRIPE_PIECE` (256 KiB, larger past 16 pieces) over `STRATA_UCX_LANES` (4) TCP "
         "connections per peer. strata only, the same build with `STRATA_UCX_LANES=1` and with its "
         "default, alternating within each of %d round(s); per size the median over the rounds of "
         "each round's time (µs). Ratio = one lane's time ÷ four lanes' (> 1: faster striped). † marks "
         "the cells where no message reaches 512 KiB: the same code runs in both, so their spread is "
         "this machine's noise between runs." % rounds, "",
         "Reproduce: `%s` (root; writes this section only)." % command, ""]
    for p in layouts:
        sizes = sorted({s for k, d in runs.items() if k[2] == p for s in d})
        header = ["collective"] + [human(s) for s in sizes]
        rows = []
        for c in colls:
            one, four = runs.get(("1", c, p), {}), runs.get(("default", c, p), {})
            cells = [c]
            for s in sizes:
                if one.get(s) and four.get(s):
                    a, b = statistics.median(one[s]), statistics.median(four[s])
                    same = largest_message(c, s, p) < STRIPE_MIN
                    cells.append("%s / %s = %.2f×%s" % (ft(a), ft(b), a / b, " †" if same else ""))
                else:
                    cells.append("")
            rows.append(cells)
        L += ["### 2 hosts × %d rank%s: one lane / four lanes (µs)" % (p, "s" if p > 1 else ""), ""]
        L += md_table(header, rows, "l" + "r" * len(sizes)) + [""]
    return L + [END]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--docs", default="docs")
    ap.add_argument("--command", default="scripts/bench_lanes.sh")
    o = ap.parse_args()
    runs = load(o.out)
    if not runs:
        print("perf_lanes_report: no results under %s" % o.out, file=sys.stderr)
        return 1
    path = os.path.join(o.docs, "PERFORMANCE_MULTIHOST.md")
    if not replace_section(path, lines(runs, o.command), BEGIN, END):
        print("perf_lanes_report: %s is missing: run scripts/bench_multihost.sh first" % path, file=sys.stderr)
        return 1
    print("perf_lanes_report: wrote the lanes section of %s" % path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
