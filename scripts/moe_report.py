#!/usr/bin/env python3
"""Turns the results of scripts/bench_moe.sh into docs/PERFORMANCE_MOE.md + docs/perf_moe.png and
refreshes the MoE section of docs/PERFORMANCE.md (scripts/perf_report.py keeps that section when it
rewrites PERFORMANCE.md, reading the headline block back from PERFORMANCE_MOE.md)."""

import argparse
import json
import os
import platform
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report_common import between, cpu_model, md_row, md_rule, pyplot, read_text, replace_section, times, write_lines  # noqa: E402

# The hand-written "Across hosts" section of PERFORMANCE_MOE.md, kept when the file is rewritten.
XHOST_BEGIN = "<!-- moe-xhost -->"
XHOST_END = "<!-- /moe-xhost -->"

HEAD_BEGIN = "<!-- moe-headline -->"
HEAD_END = "<!-- /moe-headline -->"
BW_BEGIN = "<!-- moe-bandwidth -->"  # notes on bandwidth work (issue 17), kept as written
BW_END = "<!-- /moe-bandwidth -->"
SERVE_BEGIN = "<!-- serve-begin -->"  # the section scripts/bench_moe_serve.py writes
SERVE_END = "<!-- serve-end -->"
SECTION = "## MoE dispatch/combine"
TARGET_RELAY = 1.4
TARGET_MPI = 2.0


def load(results_dir):
    rows = []
    with open(os.path.join(results_dir, "results.jsonl")) as f:
        for line in f:
            line = line.strip()
            if line:
                rows.append(json.loads(line))
    return rows


def machine():
    cpu = cpu_model()
    mem = "?"
    m = re.search(r"MemTotal:\s+(\d+)", read_text("/proc/meminfo"))
    if m:
        mem = "%.1f GiB" % (int(m.group(1)) / 1048576)
    return "%s, %d CPUs, %s, Linux %s" % (cpu, os.cpu_count() or 0, mem, platform.release())


def case_key(r):
    return (0 if r["phase"] == "prefill" else 1, r["tokens"])


def case_name(r):
    return "%s %d tok/rank, H %d" % (r["phase"], r["tokens"], r["hidden"])


def total(r):
    return r["dispatch_us"] + r["combine_us"]


def fmt_us(us):
    return "%.0f" % us if us >= 100 else "%.1f" % us


def index(rows):
    """(ranks, phase, tokens) -> {method: row}"""
    out = {}
    for r in rows:
        out.setdefault((r["ranks"], r["phase"], r["tokens"]), {})[r["method"]] = r
    return out


def headline(idx, ranks):
    """The R = `ranks` table: the schedule made for the phase vs Relay and Open MPI."""
    L = [md_row(["case", "schedule", "dispatch µs", "combine µs", "total µs", "Relay total µs", "Open MPI total µs",
                 "× vs Relay (≥ %.1f)" % TARGET_RELAY, "× vs Open MPI (≥ %.1f)" % TARGET_MPI]), md_rule("llrrrrrrr")]
    met = misses = 0
    for key in sorted((k for k in idx if k[0] == ranks), key=lambda k: (k[1] != "prefill", k[2])):
        m = idx[key]
        best = m.get("strata-" + key[1])
        if not best:
            continue
        relay, mpi = m.get("strata-relay"), m.get("openmpi")
        cells = []
        for other, target in ((relay, TARGET_RELAY), (mpi, TARGET_MPI)):
            if other and total(best) > 0:
                x = total(other) / total(best)
                ok = x >= target
                met += ok
                misses += not ok
                cells.append("%s %s" % (times(x), "✓" if ok else "✗"))
            else:
                cells.append("–")
        L.append(md_row([case_name(best), key[1], fmt_us(best["dispatch_us"]), fmt_us(best["combine_us"]),
                         fmt_us(total(best)), fmt_us(total(relay)) if relay else "–",
                         fmt_us(total(mpi)) if mpi else "–"] + cells))
    return L, met, misses


def full_table(idx, ranks):
    L = [md_row(["case", "method", "dispatch µs", "combine µs", "total µs", "dispatch GB/s", "combine GB/s",
                 "dispatch % memcpy", "combine % memcpy", "× vs Relay", "× vs Open MPI"]), md_rule("llrrrrrrrrr")]
    order = ["strata-prefill", "strata-decode", "strata-relay", "openmpi"]
    for key in sorted((k for k in idx if k[0] == ranks), key=lambda k: (k[1] != "prefill", k[2])):
        m = idx[key]
        relay, mpi = m.get("strata-relay"), m.get("openmpi")
        for meth in sorted(m, key=lambda x: order.index(x) if x in order else 99):
            r = m[meth]
            vr = times(total(relay) / total(r)) if relay and total(r) > 0 else "–"
            vm = times(total(mpi) / total(r)) if mpi and total(r) > 0 else "–"
            mc = r.get("memcpy_gbs")  # the same run's memcpy reference (strata rows only)
            pd = "%.0f%%" % (100 * r["dispatch_gbs"] / mc) if mc else "–"
            pc = "%.0f%%" % (100 * r["combine_gbs"] / mc) if mc else "–"
            L.append(md_row([case_name(r), meth, fmt_us(r["dispatch_us"]), fmt_us(r["combine_us"]), fmt_us(total(r)),
                             "%.2f" % r["dispatch_gbs"], "%.2f" % r["combine_gbs"], pd, pc, vr, vm]))
    return L


def plot(idx, path):
    plt = pyplot("moe_report")
    if plt is None:
        return False
    ranks = sorted({k[0] for k in idx})
    methods = ["strata-prefill", "strata-decode", "strata-relay", "openmpi"]
    colors = {"strata-prefill": "#1f77b4", "strata-decode": "#2ca02c", "strata-relay": "#ff7f0e", "openmpi": "#d62728"}
    fig, axes = plt.subplots(1, len(ranks), figsize=(5.2 * len(ranks), 4.4), squeeze=False)
    for ax, n in zip(axes[0], ranks):
        keys = sorted((k for k in idx if k[0] == n), key=lambda k: (k[1] != "prefill", k[2]))
        width = 0.2
        for j, meth in enumerate(methods):
            xs, ys = [], []
            for i, k in enumerate(keys):
                r = idx[k].get(meth)
                if r:
                    xs.append(i + (j - 1.5) * width)
                    ys.append(total(r))
            if xs:
                ax.bar(xs, ys, width, label=meth, color=colors[meth])
        ax.set_yscale("log")
        ax.set_xticks(range(len(keys)))
        ax.set_xticklabels(["%s\n%d tok" % (k[1], k[2]) for k in keys])
        ax.set_ylabel("dispatch + combine (µs, median)")
        ax.set_title("%d ranks" % n)
        ax.grid(True, axis="y", which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("MoE dispatch + combine, bfloat16, top-8 of 64 experts (lower is better)")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return True


def update_performance_md(docs, block):
    """Replaces (or appends) the MoE section of PERFORMANCE.md."""
    replace_section(os.path.join(docs, "PERFORMANCE.md"), block, SECTION)


def section_for_performance_md(head_lines):
    return [SECTION, "",
            "Relay-buffer-free dispatch/combine (`strata::moe`, issue 5) against its Relay baseline and Open MPI "
            "(Megatron-style all-to-all), R = 2, 4, 8: [PERFORMANCE_MOE.md](PERFORMANCE_MOE.md), measured by "
            "`scripts/bench_moe.sh`. Headline, 2 ranks:", ""] + head_lines + [
                "", "Serving a small MoE model (TTFT/TPOT p50/p99 of `examples/moe_serve`, the same paths): "
                "[PERFORMANCE_MOE.md](PERFORMANCE_MOE.md#serving-ttft-and-tpot-examplesmoe_serve), measured by "
                "`make bench-moe-serve`.", ""]


def section_lines(docs):
    """The MoE section of PERFORMANCE.md with the headline table read back from PERFORMANCE_MOE.md
    (scripts/perf_report.py keeps the section this way without re-running the benchmark); [] when
    there is no PERFORMANCE_MOE.md."""
    path = os.path.join(docs, "PERFORMANCE_MOE.md")
    if not os.path.exists(path):
        return []
    return section_for_performance_md(between(read_text(path), HEAD_BEGIN, HEAD_END).splitlines())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", required=True)
    ap.add_argument("--docs", default="docs")
    ap.add_argument("--command", default="scripts/bench_moe.sh")
    o = ap.parse_args()
    rows = load(o.results)
    if not rows:
        sys.stderr.write("moe_report: no results\n")
        return 1
    idx = index(rows)
    ranks = sorted({k[0] for k in idx})
    png = os.path.join(o.docs, "perf_moe.png")
    have_plot = plot(idx, png)
    head, met, misses = headline(idx, 2 if 2 in ranks else ranks[0])
    L = ["# Strata performance: MoE dispatch and combine", "",
         "Generated by `scripts/moe_report.py` from one run of:", "", "```sh", o.command, "```", "",
         "- Date: %s; machine: %s" % (time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), machine()),
         "- Load average at start / end of the run: %s / %s (the machine is shared: compare ratios within "
         "one run, not absolute figures)" % (read_text(os.path.join(o.results, "load_start"), "?"),
                                              read_text(os.path.join(o.results, "load_end"), "?")), "",
         "## Method", "",
         "- Cases: prefill 4096 tokens/rank × hidden 4096; decode 1, 32, 128 tokens/rank × hidden 7168; "
         "bfloat16 rows, top-8 of 64 experts, uniform routing (the same tokens and routing on every side, "
         "`src/cli/bench_moe.hpp`).",
         "- `strata-prefill`, `strata-decode`: `strata::moe::Buffer` schedules (rows written straight into "
         "the destination's expert window; combine reads expert outputs in place). `strata-relay`: the "
         "buffer-centric baseline in the same library (pack by destination, all_to_all counts, "
         "all_to_all_v rows, unpack into expert order; the reverse for combine). `openmpi`: "
         "`bench/peers/mpi_moe_bench` — permute, `MPI_Alltoall` counts, `MPI_Alltoallv` rows, sort "
         "chunks by expert; the reverse plus the fp32 weighted sum for combine, as Megatron's all-to-all "
         "dispatcher.",
         "- Identity experts (y = the received rows), so the figures are communication plus the "
         "combine's weighted fp32 sum; every run's output is checked (out = x · Σw).",
         "- Waiting: Open MPI polls without sleeping; the strata runs get the same with "
         "`STRATA_SPIN_US=100000` (the library's default spins 500 µs, then yields and sleeps on a futex, "
         "and a rank that sleeps on a loaded 2-core machine needs ~1 ms to run again, which would "
         "dominate every decode figure). With more ranks than cores the library spins ~0 regardless.",
         "- The strata schedules take turns iteration by iteration (one Buffer), so a burst of load "
         "from elsewhere hits them alike; Open MPI runs as its own job right after.",
         "- Per iteration: barrier, dispatch, barrier, combine. Each phase's time is the slowest rank's; "
         "the figure is the median over the timed iterations after warm-up. GB/s counts hidden × 2 "
         "bytes per (token, expert) selection per rank, as DeepEP does.",
         "- % memcpy: the schedule's GB/s over a memcpy of the same bytes (one row per selection) that "
         "every rank makes at once, in the same rotation of the same run (`strata bench moe` prints it "
         "per case): the bandwidth targets of issue 17 (dispatch ≥ 85%, combine ≥ 75%) are read "
         "against it.", "",
         "## Headline: 2 ranks (targets of issue 5: ≥ %.1f× vs Relay, ≥ %.1f× vs Open MPI)" % (
             TARGET_RELAY, TARGET_MPI), "",
         "%d of %d targets met." % (met, met + misses), "", HEAD_BEGIN] + head + [HEAD_END, ""]
    if have_plot:
        L += ["![dispatch + combine time](perf_moe.png)", ""]
    for n in ranks:
        L += ["## %d ranks" % n, ""] + full_table(idx, n) + [""]
    path = os.path.join(o.docs, "PERFORMANCE_MOE.md")
    # Sections other runs write are kept as they are: serving (scripts/bench_moe_serve.py) and
    # across hosts (scripts/bench_moe_multihost.sh).
    old = read_text(path)
    b, e = old.find(SERVE_BEGIN), old.find(SERVE_END)
    if 0 <= b < e:
        L += [old[b:e + len(SERVE_END)], ""]
    bw = between(old, BW_BEGIN, BW_END)
    if bw:
        L += [BW_BEGIN, bw, BW_END, ""]
    kept = between(old, XHOST_BEGIN, XHOST_END)
    if kept:
        L += [XHOST_BEGIN, kept, XHOST_END, ""]
    write_lines(path, L)
    update_performance_md(o.docs, section_for_performance_md(head))
    print("moe_report: wrote %s (%d of %d R=2 targets met)" % (path, met, met + misses))
    return 0


if __name__ == "__main__":
    sys.exit(main())
