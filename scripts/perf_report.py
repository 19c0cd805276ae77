#!/usr/bin/python3
"""Writes docs/PERFORMANCE.md and its plots from one run of scripts/bench_all.sh.

    /usr/bin/python3 scripts/perf_report.py build/bench-results [--docs docs]

Reads every JSON document of the run (strata bench, bench/peers/mpi_bench, torch_bench.py:
format "strata-bench/1"; memcpy.json; machine.json), and writes:
  PERFORMANCE.md  the targets of issue 3 with measured ratios and PASS/MISS, the method,
                  the machine, and per collective the tables (median time, busbw, ratios)
  perf_<collective>_n<ranks>.png   busbw and time vs size, log axes, one line per system
Without matplotlib the tables are still written and the plots are named as missing.
"""

import argparse
import glob
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import moe_report  # noqa: E402
import neighbour_report  # noqa: E402
import perf_multihost_report  # noqa: E402
from report_common import (fb, fr, ft, human, log_axes, md_row, md_rule, md_table, pyplot, read_json,  # noqa: E402
                           write_lines)

ORDER = ["strata-heap", "strata-external", "strata-registered", "openmpi", "openmpi-malloc-tuned", "gloo"]
SHORT = {"strata-heap": "strata heap", "strata-external": "strata external", "strata-registered": "strata registered",
         "openmpi": "Open MPI", "openmpi-malloc-tuned": "Open MPI malloc-tuned", "gloo": "gloo"}
MPI = ["openmpi", "openmpi-malloc-tuned"]
KiB, MiB = 1024, 1024 * 1024


class Runs:
    def __init__(self, path):
        self.rows = {}  # (label, coll, n) -> {size: row}, the best round per size
        self.rounds = {}  # (label, coll, n) -> number of rounds measured
        self.docs = {}
        self.memcpy = None  # the faster of the probes (the stricter reference)
        self.memcpys = []  # (name, doc)
        self.machine = {}
        self.loads = []  # (measurement, 1-minute load average before it)
        self.busy = []  # (measurement, % of CPU time other processes used just before it)
        load_path = os.path.join(path, "load.tsv")
        if os.path.exists(load_path):
            with open(load_path) as fh:
                for line in fh:
                    f = line.strip().split("\t")
                    try:
                        self.loads.append((f[0], float(f[1])))
                        if len(f) > 2:
                            self.busy.append((f[0], float(f[2])))
                    except (ValueError, IndexError):
                        pass
        for f in sorted(glob.glob(os.path.join(path, "*.json"))):
            d = read_json(f, who="perf_report")
            if d is None:
                continue
            base = os.path.basename(f)
            if base == "machine.json":
                self.machine = d
            elif d.get("system") == "memcpy":
                self.memcpys.append((base[:-5], d))
                if not self.memcpy or d["per_thread_mean_gbs"] > self.memcpy["per_thread_mean_gbs"]:
                    self.memcpy = d
            elif d.get("format") == "strata-bench/1":
                key = (d["label"], d["collective"], d["nranks"])
                self.docs[key] = d
                self.rounds[key] = self.rounds.get(key, 0) + 1
                best = self.rows.setdefault(key, {})
                for r in d["results"]:
                    old = best.get(r["size"])
                    # The faster round wins; a failed check is kept (never hidden by a better round).
                    if old is None or (old.get("check") != "FAIL" and (
                            r.get("check") == "FAIL" or (r["time_us"] and r["time_us"] < old["time_us"]))):
                        best[r["size"]] = r

    def labels(self, coll, n):
        return [l for l in ORDER if (l, coll, n) in self.rows] + sorted(
            {k[0] for k in self.rows if k[1] == coll and k[2] == n and k[0] not in ORDER})

    def groups(self):
        seen = []
        for k in self.rows:
            if (k[1], k[2]) not in seen:
                seen.append((k[1], k[2]))
        order = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"]
        return sorted(seen, key=lambda g: (g[1], order.index(g[0]) if g[0] in order else 99, g[0]))

    def sizes(self, coll, n):
        s = set()
        for l in self.labels(coll, n):
            s |= set(self.rows[(l, coll, n)])
        return sorted(s)

    def get(self, label, coll, n, size, field):
        r = self.rows.get((label, coll, n), {}).get(size)
        return None if r is None else r.get(field)

    def best_mpi(self, coll, n, size, field):
        vals = [self.get(l, coll, n, size, field) for l in MPI]
        vals = [v for v in vals if v]
        if not vals:
            return None
        return min(vals) if field == "time_us" else max(vals)


def ratio_series(runs, coll, n, lo, hi, num, den):
    """[(size, ratio)] for sizes in [lo, hi] where both sides exist; num/den are callables."""
    out = []
    for s in runs.sizes(coll, n):
        if lo <= s <= hi:
            a, b = num(s), den(s)
            if a and b:
                out.append((s, a / b))
    return out


def verdict(series, want, higher_is_better=True):
    if not series:
        return None, "not measured", "—"
    worst = min(series, key=lambda x: x[1]) if higher_is_better else max(series, key=lambda x: x[1])
    med = statistics.median(r for _, r in series)
    ok = worst[1] >= want if higher_is_better else worst[1] <= want
    text = "worst %s at %s, median %s over %d sizes" % (fr(worst[1]), human(worst[0]), fr(med), len(series))
    return ok, text, "PASS" if ok else "**MISS**"


def targets(runs):
    """The targets of issue 3 (2 ranks, fp32, heap buffers unless said), as table rows."""
    rows = []
    t = lambda l, c, n: (lambda s: runs.get(l, c, n, s, "time_us"))
    bw = lambda l, c, n: (lambda s: runs.get(l, c, n, s, "busbw_gbs"))
    inv = lambda f: (lambda s: (1.0 / f(s)) if f(s) else None)
    mpi_t = lambda c, n: (lambda s: runs.best_mpi(c, n, s, "time_us"))
    mpi_bw = lambda c, n: (lambda s: runs.best_mpi(c, n, s, "busbw_gbs"))

    ser = ratio_series(runs, "all_reduce", 2, 16 * MiB, 256 * MiB, bw("strata-heap", "all_reduce", 2),
                       bw("openmpi-malloc-tuned", "all_reduce", 2))
    rows.append(("all_reduce busbw 16–256 MiB ≥ 2× Open MPI malloc-tuned", "≥ 2×") + verdict(ser, 2.0)[1:])
    if runs.memcpy:
        pt = runs.memcpy["per_thread_mean_gbs"]
        ser = ratio_series(runs, "all_reduce", 2, 16 * MiB, 256 * MiB, bw("strata-heap", "all_reduce", 2),
                           lambda s: pt)
        rows.append(("all_reduce busbw 16–256 MiB ≥ 0.6× memcpy per process, 2 copying at once (%.1f GB/s; "
                     "0.8× is the limit)" % pt, "≥ 0.6×") + verdict(ser, 0.6)[1:])
    ser = ratio_series(runs, "all_reduce", 2, 8, 128, t("strata-heap", "all_reduce", 2), mpi_t("all_reduce", 2))
    rows.append(("all_reduce time 8–128 B no slower than Open MPI (strata ÷ faster Open MPI variant)", "≤ 1×")
                + verdict(ser, 1.0, False)[1:])
    ser = ratio_series(runs, "all_reduce", 2, 512, 64 * KiB, t("strata-heap", "all_reduce", 2),
                       mpi_t("all_reduce", 2))
    rows.append(("all_reduce time 512 B–64 KiB ≤ 0.5× Open MPI (strata ÷ faster Open MPI variant)", "≤ 0.5×")
                + verdict(ser, 0.5, False)[1:])
    for c in ("all_gather", "reduce_scatter", "all_to_all"):
        ser = ratio_series(runs, c, 2, MiB, 1 << 40, bw("strata-heap", c, 2), mpi_bw(c, 2))
        rows.append(("%s busbw ≥ 1 MiB ≥ 1.5× Open MPI (faster variant)" % c, "≥ 1.5×") + verdict(ser, 1.5)[1:])
    for c in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        ser = ratio_series(runs, c, 2, 0, 1 << 40, t("gloo", c, 2), t("strata-heap", c, 2))
        note = " (gloo: all_reduce + copy, it has no reduce_scatter)" if c == "reduce_scatter" else ""
        rows.append(("%s ≥ 10× gloo at every size (gloo time ÷ strata time)%s" % (c, note), "≥ 10×")
                    + verdict(ser, 10.0)[1:])
    for buf in ("strata-external", "strata-registered"):
        for c in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
            ser = ratio_series(runs, c, 2, MiB, 1 << 40, bw(buf, c, 2), mpi_bw(c, 2))
            what = "external buffers (staged)" if buf == "strata-external" else "registered external buffers (CMA)"
            rows.append(("%s %s never slower than Open MPI at ≥ 1 MiB" % (c, what), "≥ 1×")
                        + verdict(ser, 1.0)[1:])
    for n in sorted({k[2] for k in runs.rows if k[2] > 2 and k[1] == "all_reduce"}):
        ser = ratio_series(runs, "all_reduce", n, 0, 1 << 40, t("strata-heap", "all_reduce", n),
                           mpi_t("all_reduce", n))
        rows.append(("all_reduce %d ranks on %s cores: at least as fast as Open MPI (strata ÷ faster variant)"
                     % (n, runs.machine.get("nproc", "?")), "≤ 1×") + verdict(ser, 1.0, False)[1:])
        jumps = explosions(runs, "strata-heap", "all_reduce", n)
        rows.append(("all_reduce %d ranks: no size where the time explodes" % n, "none",
                     "none" if not jumps else "; ".join(jumps), "PASS" if not jumps else "**MISS**"))
    return rows


# ---- issue 19: every row against its target ---------------------------------------------------

ROW_VS_MPI = 1.2     # every (collective, size, buffer kind) row: Open MPI time ÷ strata time
ROW_OF_LIMIT = 0.85  # heap all_reduce / all_to_all busbw ÷ memcpy-derived limit at ≥ 1 MiB
ROW_MAX_DROP = 0.2   # heap all_reduce / all_to_all: busbw falls by at most this from one size to the next
ROW_EXT_OF_HEAP = 0.6  # external / registered busbw ÷ heap busbw at ≥ 1 MiB
# busbw a copy-bound 2-rank collective can reach, as a fraction of the per-process memcpy rate
# with both cores copying: two-shot all_reduce copies 1.25× the buffer per rank (busbw ≤ 0.8×);
# all_to_all copies the whole buffer once per rank (busbw = algbw ÷ 2 ≤ 0.5×).
LIMIT_OF_MEMCPY = {"all_reduce": 0.8, "all_to_all": 0.5}


def row_checks(runs, label, coll, n, size, prev_size):
    """[(what, ratio, wanted, ok)] for one (collective, size, buffer kind) row: the targets of
    issue 19 that apply to it, each a ratio measured in this run."""
    out = []
    t = runs.get(label, coll, n, size, "time_us")
    bw = runs.get(label, coll, n, size, "busbw_gbs")
    mpi = runs.best_mpi(coll, n, size, "time_us")
    if t and mpi:
        r = mpi / t
        out.append(("÷ Open MPI", r, "≥ %g×" % ROW_VS_MPI, r >= ROW_VS_MPI))
    heap_kind = label == "strata-heap" and n == 2 and coll in LIMIT_OF_MEMCPY
    if heap_kind and bw and runs.memcpy and size >= MiB:
        r = bw / (LIMIT_OF_MEMCPY[coll] * runs.memcpy["per_thread_mean_gbs"])
        out.append(("of limit", r, "≥ %d%%" % round(100 * ROW_OF_LIMIT), r >= ROW_OF_LIMIT))
    if heap_kind and bw and prev_size is not None:
        pbw = runs.get(label, coll, n, prev_size, "busbw_gbs")
        if pbw:
            r = bw / pbw
            out.append(("vs %s" % human(prev_size), r, "≥ %d%%" % round(100 * (1 - ROW_MAX_DROP)),
                        r >= 1 - ROW_MAX_DROP))
    if label in ("strata-external", "strata-registered") and size >= MiB and bw:
        hbw = runs.get("strata-heap", coll, n, size, "busbw_gbs")
        if hbw:
            r = bw / hbw
            out.append(("of heap", r, "≥ %d%%" % round(100 * ROW_EXT_OF_HEAP), r >= ROW_EXT_OF_HEAP))
    return out


def _pct_or_times(what, r):
    return fr(r) if what.startswith("÷") else "%.0f%%" % (100 * r)


def row_target_tables(runs):
    """Per collective and rank count, one row per (size, buffer kind) with each ratio against its
    target and whether the row meets all of them; and (met, rows, misses per target)."""
    L, met, total, miss = [], 0, 0, {}
    kinds = ("strata-heap", "strata-external", "strata-registered")
    for coll, n in runs.groups():
        labels = [l for l in kinds if (l, coll, n) in runs.rows]
        if not labels or not any((m, coll, n) in runs.rows for m in MPI):
            continue
        rows = []
        for label in labels:
            sizes = sorted(runs.rows[(label, coll, n)])
            for prev, size in zip([None] + sizes, sizes):
                checks = row_checks(runs, label, coll, n, size, prev)
                if not checks:
                    continue
                ok = all(c[3] for c in checks)
                total += 1
                met += ok
                for c in checks:
                    if not c[3]:
                        key = c[0] if not c[0].startswith("vs ") else "drop"
                        miss[key] = miss.get(key, 0) + 1
                rows.append([human(size), SHORT[label].replace("strata ", ""),
                             "; ".join("%s %s (%s)%s" % (w, _pct_or_times(w, r), want, "" if good else " ✗")
                                       for w, r, want, good in checks),
                             "✓" if ok else "**✗**"])
        L += ["### %s, %d ranks" % (coll, n), ""] + md_table(["size", "buffer", "ratios (target)", "meets"], rows,
                                                            "rlll") + [""]
    return L, met, total, miss


def row_target_summary(met, total, miss):
    names = {"÷ Open MPI": "≥ %g× Open MPI" % ROW_VS_MPI, "of limit": "≥ %d%% of the limit" % (100 * ROW_OF_LIMIT),
             "drop": "busbw drop > %d%% from the size before" % (100 * ROW_MAX_DROP),
             "of heap": "≥ %d%% of heap" % (100 * ROW_EXT_OF_HEAP)}
    why = ", ".join("%s: %d" % (names.get(k, k), v) for k, v in sorted(miss.items()))
    return "%d of %d rows meet every target%s." % (met, total, " (misses by target — %s)" % why if why else "")


def explosions(runs, label, coll, n):
    """Sizes where the time grows much faster than the size (more than max(4, 2 × size step))."""
    rows = runs.rows.get((label, coll, n), {})
    sizes = sorted(rows)
    out = []
    for a, b in zip(sizes, sizes[1:]):
        ta, tb = rows[a]["time_us"], rows[b]["time_us"]
        if ta and tb and tb / ta > max(4.0, 2.0 * b / a):
            out.append("%s → %s: %s µs → %s µs" % (human(a), human(b), ft(ta), ft(tb)))
    return out


def zero_copy_gain(runs):
    lines = []
    for c in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        for buf in ("strata-external", "strata-registered"):
            ser = ratio_series(runs, c, 2, MiB, 1 << 40, lambda s: runs.get("strata-heap", c, 2, s, "busbw_gbs"),
                               lambda s: runs.get(buf, c, 2, s, "busbw_gbs"))
            if ser:
                lines.append(md_row([c, SHORT[buf], fr(statistics.median(r for _, r in ser)),
                                     "%s–%s" % (fr(min(r for _, r in ser)), fr(max(r for _, r in ser)))]))
    return lines


def plot(runs, coll, n, path):
    plt = pyplot()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.4))
    styles = {"strata-heap": "o-", "strata-external": "s--", "strata-registered": "^--", "openmpi": "v-",
              "openmpi-malloc-tuned": "D-", "gloo": "x-"}
    for l in runs.labels(coll, n):
        rows = runs.rows[(l, coll, n)]
        xs = sorted(s for s in rows if s > 0 and rows[s]["time_us"])
        a1.plot(xs, [rows[s]["busbw_gbs"] for s in xs], styles.get(l, ".-"), label=SHORT.get(l, l), ms=4)
        a2.plot(xs, [rows[s]["time_us"] for s in xs], styles.get(l, ".-"), label=SHORT.get(l, l), ms=4)
    if runs.memcpy and n == 2:
        pt = runs.memcpy["per_thread_mean_gbs"]
        a1.axhline(pt, color="gray", ls=":", lw=1)
        xmin = min(s for s in runs.sizes(coll, n) if s > 0)
        a1.text(xmin, pt * 1.05, "memcpy per process, 2 at once (%.1f GB/s)" % pt, color="gray", fontsize=8)
    for a, yl in ((a1, "busbw (GB/s)"), (a2, "median time (µs)")):
        log_axes(a, "size (bytes)", yl)
    a1.legend(fontsize=8)
    fig.suptitle("%s, %d ranks, float32 (one run of scripts/bench_all.sh)" % (coll, n))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def table(runs, coll, n, field, fmt):
    labels = runs.labels(coll, n)
    rows = []
    for s in runs.sizes(coll, n):
        cells = [human(s)]
        for l in labels:
            v = runs.get(l, coll, n, s, field)
            chk = runs.get(l, coll, n, s, "check")
            cells.append(fmt(v) + (" FAIL" if chk == "FAIL" else ""))
        rows.append(cells)
    return md_table(["size"] + [SHORT.get(l, l) for l in labels], rows, "r" * (len(labels) + 1))


def ratio_table(runs, coll, n):
    labels = runs.labels(coll, n)
    cols = [(l, "strata heap ÷ %s" % SHORT[l]) for l in ("openmpi", "openmpi-malloc-tuned", "gloo") if l in labels]
    cols += [(l, "heap ÷ %s" % SHORT[l].replace("strata ", "")) for l in ("strata-external", "strata-registered")
             if l in labels]
    if "strata-heap" not in labels or not cols:
        return []
    rows = []
    for s in runs.sizes(coll, n):
        th = runs.get("strata-heap", coll, n, s, "time_us")
        cells = [human(s)]
        for l, _ in cols:
            tp = runs.get(l, coll, n, s, "time_us")
            cells.append(fr(tp / th) if th and tp else "")
        rows.append(cells)
    return md_table(["size"] + [c[1] for c in cols], rows, "r" * (len(cols) + 1))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", help="directory of one bench_all.sh run")
    ap.add_argument("--docs", default="docs", help="where PERFORMANCE.md and the PNGs go")
    o = ap.parse_args()
    runs = Runs(o.results)
    if not runs.rows:
        print("perf_report: no results in %s" % o.results, file=sys.stderr)
        return 1
    os.makedirs(o.docs, exist_ok=True)
    have_mpl = pyplot() is not None
    if not have_mpl:
        print("perf_report: matplotlib is missing for %s: no plots (scripts/install_bench_deps.sh)" % sys.executable,
              file=sys.stderr)

    m = runs.machine
    L = []
    L += ["# Performance", "",
          "Generated by `scripts/perf_report.py` from one run of `scripts/bench_all.sh`%s; do not edit by hand "
          "(rerun instead). Every ratio below compares systems measured in that one run." %
          (" in QUICK mode (fewer sizes and repeats)" if m.get("quick") else ""), "",
          "Reproduce (as root, on an idle machine if you can):", "", "```sh",
          "scripts/install_bench_deps.sh                        # Open MPI, torch (gloo), numpy, matplotlib",
          "cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release && cmake --build build",
          "BUILD_DIR=build scripts/bench_all.sh                 # ~10-15 min; QUICK=1 for a ~2 min pass",
          "# or: make bench", "```", "",
          "One system by hand: `strata bench all_reduce -n 2 -b 8 -e 256M -f 2 --json ar.json --plot ar.png`; "
          "the peers: `mpirun --allow-run-as-root -np 2 build/bench/peers/mpi_bench all_reduce -b 8 -e 256M`, "
          "`/usr/bin/python3 bench/peers/torch_bench.py all_reduce -n 2 -b 8 -e 256M`.", ""]
    L += ["## Machine", "",
          "| | |", "|---|---|",
          "| date (UTC) | %s |" % m.get("date", "?"),
          "| CPU | %s, %s logical CPUs (`nproc`) |" % (m.get("cpu", "?"), m.get("nproc", "?")),
          "| memory | %s GiB |" % m.get("mem_gib", "?"),
          "| kernel | %s |" % m.get("kernel", "?"),
          "| load average (1/5/15 min) at start / end | %s / %s |" % (m.get("loadavg_start", "?"),
                                                                     m.get("loadavg_end", "?")),
          "| Open MPI | %s |" % m.get("openmpi", "not found"),
          "| torch | %s (gloo) |" % (m.get("torch") or "not found"),
          "| strata | git %s |" % m.get("git", "?"),
          "| run time | %s s |" % m.get("seconds", "?")]
    if runs.loads:
        ls = [v for _, v in runs.loads]
        L += ["| 1-min load average before each of the %d measurements (includes our own previous ranks) | "
              "min %.2f, median %.2f, max %.2f |" % (len(ls), min(ls), statistics.median(ls), max(ls))]
    if runs.busy:
        bs = [v for _, v in runs.busy]
        L += ["| CPU time taken by other processes just before each measurement | min %d%%, median %d%%, "
              "max %d%%; over 50%% before %d of %d |" % (min(bs), statistics.median(bs), max(bs),
                                                        sum(1 for v in bs if v > 50), len(bs))]
    L += [""]
    nproc = float(m.get("nproc") or 2)
    if runs.busy:
        busy_run = statistics.median(v for _, v in runs.busy) > 25
        why = "a median %d%% of the CPU time was taken by other processes" % statistics.median(
            v for _, v in runs.busy)
    else:
        busy_run = bool(runs.loads) and statistics.median(v for _, v in runs.loads) > nproc
        why = "median 1-minute load %.1f on %d CPUs" % (
            statistics.median(v for _, v in runs.loads) if runs.loads else 0, nproc)
    if busy_run:
        L += ["**This run was made on a busy machine** (%s: other processes competed for the cores). "
              "Busy-polling peers suffer most from that: Open MPI's large-message "
              "bandwidth and the memcpy reference drop well below their figures on an idle machine "
              "(shared/MEASURED.md: Open MPI malloc-tuned ~4.6 GB/s at 64 MiB, memcpy ~15 GB/s per process with "
              "2 copying), so ratios against them flatter strata. Rerun on an idle machine before quoting them." % why, ""]
    L += ["The machine is shared: other processes (builds) may have run at the same time; the load average "
          "above says how busy it was. Absolute figures vary from run to run; the ratios are the point.", ""]

    L += ["## Targets (issue 3)", "",
          "2 ranks, float32, strata on heap buffers unless the row says otherwise. \"Open MPI (faster variant)\" "
          "is, per size, the faster of Open MPI default and Open MPI with the malloc settings, so the comparison "
          "is against Open MPI's best. A ratio's worst case is over every size of the range.", ""]
    trows = targets(runs)
    L += md_table(["target", "wanted", "measured", "verdict"], trows)
    misses = sum(1 for r in trows if "MISS" in r[3])
    L += ["", "%d of %d targets met." % (len(trows) - misses, len(trows)), ""]
    if misses:
        L += ["Where the time goes in the missed cases (perf over every CPU): [PROFILE.md](PROFILE.md), "
              "made by `scripts/profile_hotspots.sh`.", ""]
    zc = zero_copy_gain(runs)
    if zc:
        L += ["Zero-copy gain (busbw of heap buffers ÷ busbw of external buffers, sizes ≥ 1 MiB):", "",
              md_row(["collective", "external kind", "median", "range"]), md_rule("llrr")] + zc + [""]

    rt_lines, rt_met, rt_total, rt_miss = row_target_tables(runs)
    if rt_total:
        L += ["## Every row against its target (issue 19)", "",
              "Each (collective, size, buffer kind) row, its ratios measured in this run, each against its target: "
              "Open MPI's time (faster variant) ÷ strata's ≥ %g×; heap all_reduce and all_to_all at ≥ 1 MiB: busbw ≥ "
              "%d%% of the limit the memcpy probe allows (%s × the per-process copy rate with both cores busy: "
              "all_reduce copies 1.25× the buffer per rank, all_to_all the buffer once), and at every size busbw "
              "at least %d%% of the size before (no drop over %d%%); external and registered buffers at ≥ 1 MiB: "
              "busbw ≥ %d%% of heap buffers'. ✗ marks a ratio that misses; a row meets its target (✓) when "
              "every ratio does. The neighbour case is in its own section below." % (
                  ROW_VS_MPI, 100 * ROW_OF_LIMIT, " / ".join("%g (%s)" % (v, k) for k, v in LIMIT_OF_MEMCPY.items()),
                  100 * (1 - ROW_MAX_DROP), 100 * ROW_MAX_DROP, 100 * ROW_EXT_OF_HEAP), "",
              "**%s**" % row_target_summary(rt_met, rt_total, rt_miss), ""] + rt_lines

    L += ["## Method", "",
          "- **Time** per size: after %s warm-up calls, one timed call sizes a loop of `iters` back-to-back calls "
          "lasting about %s ms (or `--iters`); the loop is timed %s times (a barrier before each), each repeat's "
          "time being loop time ÷ iters of the *slowest* rank; the table shows the **median of the repeats**. "
          "This is the nccl-tests method (time a loop, divide) made robust to a noisy machine: a loop measures "
          "the steady state, including any overlap between consecutive calls, without a barrier in every "
          "iteration (which would add its own latency and skew), and the median over repeats drops repeats "
          "that another process interrupted. strata bench, mpi_bench and torch_bench.py run this same loop "
          "(the first two share its code, `src/cli/bench_common.hpp`). As in nccl-tests the inputs are not "
          "rewritten between calls, so up to about 1 MiB a peer's input stays in the reader's cache: that flatters "
          "algorithms that read whole inputs (one-shot all_reduce) against a training step, whose gradients are "
          "written just before the call. Measured both ways on this machine (2 ranks, heap, two-shot pushing into "
          "the outputs): one-shot against two-shot 0.65 against 0.86 us at 8 KiB, 0.86 against 0.82 at 16 KiB and "
          "2.4 against 2.3 at 64 KiB with unchanged inputs, 1.6 against 1.2, 2.75 against 1.6 and 7.6 against 3.7 "
          "with inputs written before each call (`strata run -n 2 build/bench/fresh_inputs_bench`); the selector "
          "follows the second (one-shot up to 8 KiB on 2 ranks)." % (
              _timing(runs, "warmup"), _timing(runs, "target_ms"), _timing(runs, "repeats")),
          "- **Size** (nccl-tests): for all_reduce, reduce, broadcast, sendrecv, the bytes of the buffer each "
          "rank passes; for all_gather, reduce_scatter, all_to_all, gather, scatter the *total* buffer "
          "(ranks × per-rank block: the all_gather output, the reduce_scatter input, the all_to_all send buffer).",
          "- **algbw** = size ÷ time; **busbw** = algbw × 2(n−1)/n for all_reduce, × (n−1)/n for all_gather, "
          "reduce_scatter, all_to_all, × 1 for broadcast and reduce (GB/s = 10⁹ B/s).",
          "- **Rounds**: the machine is shared, so every system but gloo is measured in %s rounds, the systems "
          "alternating within a round; each figure below is the best round for that system and size (the same "
          "rule for every system). gloo runs once. Small sizes depend on which state of this VM a round met: "
          "its two vCPUs switch within seconds between one where a cache line passes between them in about "
          "0.05 µs and one where that takes about 0.3 µs (`build/bench/handshake_probe`, run a few seconds "
          "apart: 512 B 0.64, 0.15, 0.51 µs). A system whose round met the fast state wins its small rows, so "
          "two full runs of the same code ten minutes apart met the issue 19 targets in 103 and in 118 of 183 "
          "rows; to compare two builds at small sizes, alternate them many times (medians), as the A/B figures "
          "in docs/SEMANTICS.md were." % _rounds(runs),
          "- Buffers are allocated once at the largest size and touched before timing (first touch of a page "
          "costs ~10 µs on these VMs); every size's result is checked once against the expected values.",
          "- Systems: **strata heap** (`comm.alloc`, zero-copy), **strata external** (malloc'd, unregistered: "
          "staged through the heap), **strata registered** (malloc'd + `register_buffer`: single-copy CMA from `STRATA_CMA_REGISTERED_MIN_BYTES`, 256 KiB; staged below, where a CMA system call costs more than the copy), "
          "**Open MPI** 4.1 default (vader shared-memory BTL), **Open MPI malloc-tuned** "
          "(`MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=4294967296`, so its temporary buffers "
          "are not mapped and unmapped per call), **gloo** (torch.distributed, one torch thread per rank; fewer "
          "sizes and at most %s iterations per repeat, as it is ~1000× slower at small sizes; out-of-place "
          "all_reduce is copy + in-place all_reduce, reduce_scatter is all_reduce + copy of the rank's block)."
          % _gloo_iters(runs), ""]

    if runs.memcpy:
        mc = runs.memcpy
        runs.memcpys.sort(key=lambda x: (0 if "start" in x[0] else 1, x[0]))
        names = [nm for nm, _ in runs.memcpys]
        probes = [d for _, d in runs.memcpys]
        L += ["## memcpy probe", "",
              "%s buffers, warm pages, GB/s = bytes copied ÷ time, median of %d repeats; run at %s. The "
              "targets use the faster probe's per-process rate (%.2f GB/s)." % (
                  human(mc["bytes"]), mc["repeats"], " and ".join(n.replace("memcpy_", "the ") for n in names),
                  mc["per_thread_mean_gbs"]), ""]
        L += md_table(["copy"] + [n.replace("memcpy_", "") for n in names], [
            ["1 thread alone"] + ["%.2f" % d["one_thread_gbs"] for d in probes],
            ["2 threads at once, each (per process)"] + [" / ".join("%.2f" % g for g in d["per_thread_gbs"])
                                                         for d in probes],
            ["2 threads at once, total"] + ["%.2f" % d["total_gbs"] for d in probes],
            ["1 MiB in cache, 1 thread"] + ["%.2f" % d["in_cache_1mib_gbs"] for d in probes],
        ], "l" + "r" * len(names))
        L += ["",
              "A two-shot all_reduce on 2 ranks that pulls the reduced slices moves 1.25× the bytes of a memcpy per "
              "process, so busbw ≤ 0.8× the per-process copy rate with both cores busy: the limit the targets use. "
              "Pushing them into heap outputs (`STRATA_PUSH`), it moves as many bytes as a memcpy (busbw ≤ 1.0×).", ""]

    for coll, n in runs.groups():
        L += ["## %s, %d ranks" % (coll, n), ""]
        png = "perf_%s_n%d.png" % (coll, n)
        if have_mpl:
            plot(runs, coll, n, os.path.join(o.docs, png))
            L += ["![%s %d ranks](%s)" % (coll, n, png), ""]
        else:
            L += ["(plot %s not made: matplotlib is missing)" % png, ""]
        fails = [l for l in runs.labels(coll, n) if any(r.get("check") == "FAIL"
                                                         for r in runs.rows[(l, coll, n)].values())]
        if fails:
            L += ["**Correctness check FAILED** for: %s." % ", ".join(fails), ""]
        L += ["Median time (µs):", ""] + table(runs, coll, n, "time_us", ft) + [""]
        L += ["busbw (GB/s):", ""] + table(runs, coll, n, "busbw_gbs", fb) + [""]
        rt = ratio_table(runs, coll, n)
        if rt:
            L += ["Ratios (peer time ÷ strata heap time = strata busbw ÷ peer busbw; > 1: strata heap faster):",
                  ""] + rt + [""]

    L += ["## torch.distributed (Python)", "",
          "Backend `strata` against `gloo` through torch.distributed (all_reduce 4 KiB–64 MiB, DDP step "
          "time): [PERFORMANCE_PYTHON.md](PERFORMANCE_PYTHON.md), measured by `python/bench_torch.py`.", ""]
    L += multihost_section(o.docs) + [""]
    L += moe_section(o.docs)
    nb = neighbour_report.section_lines(o.docs)  # kept: scripts/bench_neighbour.sh writes it
    if nb:
        L += [""] + nb

    path = os.path.join(o.docs, "PERFORMANCE.md")
    write_lines(path, L)
    print("perf_report: wrote %s (%d of %d targets met; %d of %d rows meet the issue 19 targets)" % (
        path, len(trows) - misses, len(trows), rt_met, rt_total))
    return 0


def multihost_section(docs):
    """The "Between hosts" section: a link to PERFORMANCE_MULTIHOST.md and the summary of its
    last run, written by the same code that scripts/bench_multihost.sh uses to refresh it."""
    return perf_multihost_report.section_lines(docs)


def moe_section(docs):
    """The MoE section: a link to PERFORMANCE_MOE.md (scripts/bench_moe.sh) and its headline table,
    read back from there so that this report keeps it without re-running the MoE benchmark."""
    return moe_report.section_lines(docs)


def _timing(runs, key):
    vals = sorted({float(d["timing"][key]) for d in runs.docs.values() if key in d.get("timing", {})})
    return "/".join("%g" % v for v in vals) if vals else "?"


def _rounds(runs):
    vals = sorted({v for k, v in runs.rounds.items() if k[0] != "gloo"})
    return "/".join(str(v) for v in vals) if vals else "1"


def _gloo_iters(runs):
    vals = sorted({int(d["timing"]["max_iters"]) for d in runs.docs.values()
                   if d.get("system") == "gloo" and "max_iters" in d.get("timing", {})})
    return "/".join(str(v) for v in vals) if vals else "a capped number of"


if __name__ == "__main__":
    sys.exit(main())
