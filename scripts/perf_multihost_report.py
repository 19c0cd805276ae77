#!/usr/bin/python3
"""Writes docs/PERFORMANCE_MULTIHOST.md and docs/perf_multihost.png from one run of
scripts/bench_multihost.sh, and refreshes the short "Between hosts" section of
docs/PERFORMANCE.md (the lines between its multihost markers; scripts/perf_report.py copies
the same summary when it rewrites PERFORMANCE.md).

    /usr/bin/python3 scripts/perf_multihost_report.py build/bench-multihost [--docs docs]
"""
import argparse
import glob
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report_common import (between, human, log_axes, md_row, md_rule, pyplot, read_json, read_text,  # noqa: E402
                           replace_section, times, write_lines)

SUMMARY_BEGIN = "<!-- multihost-summary:begin -->"
SUMMARY_END = "<!-- multihost-summary:end -->"
SECTION_BEGIN = "<!-- multihost:begin -->"
SECTION_END = "<!-- multihost:end -->"
LANES_BEGIN = "<!-- lanes:begin -->"  # scripts/perf_lanes_report.py
LANES_END = "<!-- lanes:end -->"
TARGET = 1.3        # issue 4: strata busbw >= 1.3x Open MPI at >= 1 MiB (all_reduce, all_to_all)
TARGET_FROM = 1 << 20
ROW_TARGET = 1.2    # issue 19: every size, strata >= 1.2x Open MPI (time ratio) in the same run
SYSTEMS = ("strata", "openmpi")
# The collectives a run may hold, in the order the report shows them; issue 4's target covers
# the first two.
COLL_ORDER = ("all_reduce", "all_to_all", "all_gather", "reduce_scatter", "broadcast", "barrier")
ISSUE4 = ("all_reduce", "all_to_all")


def load(out):
    """{(system, coll, ranks per host): {size: the median round's row}}, machine, link probe results.

    The median round, not the fastest: on this shared machine a single round of either system
    can come out twice as fast as its others (seen for Open MPI's 64 KiB broadcast), and the
    fastest of five would rest the comparison on that one outlier."""
    best, rounds, every = {}, {}, {}
    machine = read_json(os.path.join(out, "machine.json"), {})
    for path in sorted(glob.glob(os.path.join(out, "*_r*.json"))):
        # strata_all_to_all_p2_r1.json; runs before the layouts were named had no _pN.
        m = re.match(r"(strata|openmpi)_(\w+?)(?:_p(\d+))?_r(\d+)\.json$", os.path.basename(path))
        if not m:
            continue
        doc = read_json(path)
        if doc is None:
            continue
        key = (m.group(1), m.group(2), int(m.group(3) or machine.get("per_host", 2)))
        rounds.setdefault(key, set()).add(int(m.group(4)))
        for r in doc.get("results", []):
            if r.get("time_us"):
                every.setdefault(key, {}).setdefault(r["size"], []).append(r)
    for key, sizes in every.items():
        # The lower median with an even number of rounds: a row that was measured.
        best[key] = {size: sorted(rs, key=lambda r: r["time_us"])[(len(rs) - 1) // 2] for size, rs in sizes.items()}
    link = {}  # streams: [GB/s per round], one direction
    bidir = []  # [(h1 -> h0, h0 -> h1) GB/s per round], both directions at once

    def received(path):
        return json.load(open(path))["end"]["sum_received"]["bits_per_second"] / 8e9

    for path in sorted(glob.glob(os.path.join(out, "link_*stream*.json"))):
        m = re.match(r"link_(\d+)streams?(_r\d+)?\.json$", os.path.basename(path))
        if not m:
            continue
        try:
            link.setdefault(int(m.group(1)), []).append(received(path))
        except (OSError, ValueError, KeyError):
            pass
    for path in sorted(glob.glob(os.path.join(out, "link_both_r*_fwd.json"))):
        try:
            bidir.append((received(path), received(path.replace("_fwd.json", "_rev.json"))))
        except (OSError, ValueError, KeyError):
            pass
    return best, rounds, machine, link, bidir


def failed_log(out, system, coll, per_host):
    """The last meaningful line of a failed run's log, to say why a system has no figures."""
    for path in sorted(glob.glob(os.path.join(out, "%s_%s_p%d_r*.log" % (system, coll, per_host)))):
        # Agent logs carry "  err| [h0:1] " prefixes (netns_lib.sh's mh_show, the launcher's).
        lines = [re.sub(r"^(out|err)\| (\[[^]]*\] )?", "", l.strip()) for l in open(path, errors="replace")
                 if l.strip()]
        errs = [l for l in lines if "rror" in l or "nvalid" in l or "navailable" in l or "FAIL" in l]
        if errs:
            return errs[0][:300]
        if lines:
            return lines[-1][:300]
    return "no run"


def link_bound_busbw(coll, link_gbs, hosts, per_host):
    """busbw if only the link limited it: the bytes each host must send over its link per
    call, for the best schedule (hierarchical all_reduce: reduce-scatter within the host, a
    ring between hosts, all-gather within), turned into nccl-tests busbw."""
    n = hosts * per_host
    if coll == "all_reduce":
        per_host_bytes_per_size = 2.0 * (hosts - 1) / hosts
        factor = 2.0 * (n - 1) / n
    elif coll == "all_to_all":  # every rank sends (n - per_host)/n of its buffer off the host
        per_host_bytes_per_size = per_host * (n - per_host) / n
        factor = (n - 1) / n
    elif coll in ("all_gather", "reduce_scatter"):
        # size = the whole buffer (n blocks): each host's blocks (all_gather), or its partial
        # sums of each other host's blocks (reduce_scatter), go to every other host once.
        per_host_bytes_per_size = (hosts - 1) * per_host / n
        factor = (n - 1) / n
    else:  # broadcast, barrier: no bound drawn
        return None
    return link_gbs / per_host_bytes_per_size * factor


def cores_line(hosts, per_host, nproc):
    """How a layout's ranks sit on this machine's cores (all hosts share them)."""
    n = hosts * per_host
    try:
        cores = int(nproc)
    except (TypeError, ValueError):
        return "%d ranks in all with %d per host" % (n, per_host)
    if n > cores:
        return ("with %d ranks per host the %d ranks share this machine's %d cores with the kernel's TCP work"
                % (per_host, n, cores))
    return "with %d rank%s per host each rank has a core" % (per_host, "s" if per_host > 1 else "")


def layout_tables(o, best, colls, hosts, per_host, link_gbs):
    """The tables of one layout (hosts x per_host ranks): its markdown lines and its summary lines
    (per collective the targets of issues 4 and 19, and the layout's count of rows that meet 19's)."""
    L, summary, row_met, row_all = [], [], {}, {}
    where = "%d hosts × %d rank%s" % (hosts, per_host, "s" if per_host > 1 else "")
    for coll in colls:
        L += ["## %s, %s" % (coll, where), ""]
        rows_of = {s: best.get((s, coll, per_host), {}) for s in SYSTEMS}
        sizes = sorted({size for rows in rows_of.values() for size in rows})
        missing = [s for s in SYSTEMS if not rows_of[s]]
        for s in missing:
            L += ["**%s: no figures** — %s" % (s, failed_log(o.out, s, coll, per_host)), ""]
        if not sizes:
            continue
        bound = link_bound_busbw(coll, link_gbs, hosts, per_host) if link_gbs else None
        head = ["size"] + ["%s %s" % (s, what) for s in SYSTEMS for what in ("time (µs)", "busbw (GB/s)")] + \
            ["Open MPI time ÷ strata's", "≥ %g×" % ROW_TARGET] + (["best busbw ÷ link bound"] if bound else [])
        L += [md_row(head), md_rule("l" * len(head))]
        met, missed = [], []
        for size in sizes:
            cells, bw, t = [], {}, {}
            for s in SYSTEMS:
                r = rows_of[s].get(size)
                if r:
                    bw[s] = r.get("busbw_gbs") or 0
                    t[s] = r["time_us"]
                    cells += ["%.1f" % r["time_us"], "%.3f" % bw[s] if bw[s] else "–"]
                else:
                    cells += ["–", "–"]
            # The same as the busbw ratio where there is a busbw; barrier has only times.
            ratio = t["openmpi"] / t["strata"] if t.get("strata") and t.get("openmpi") else None
            cells.append(times(ratio) if ratio else "–")
            cells.append(("✓" if ratio >= ROW_TARGET else "**✗**") if ratio else "–")
            if ratio:
                row_met[coll] = row_met.get(coll, 0) + (ratio >= ROW_TARGET)
                row_all[coll] = row_all.get(coll, 0) + 1
            if bound:
                top = max(bw.values()) if bw else 0
                cells.append("%.0f%%" % (100 * top / bound) if top else "–")
            L.append(md_row([human(size) if size else "–"] + cells))
            if coll in ISSUE4 and size >= TARGET_FROM and ratio is not None:
                (met if ratio >= TARGET else missed).append((size, ratio))
        L.append("")
        if row_all.get(coll):
            L += ["%s, %s: %d of %d sizes meet strata ≥ %g× Open MPI (issue 19, every size)."
                  % (coll, where, row_met[coll], row_all[coll], ROW_TARGET), ""]
        if met or missed:
            line = "%s, %s: strata ≥ %.1f× Open MPI busbw at ≥ 1 MiB in %d of %d sizes" % (
                coll, where, TARGET, len(met), len(met) + len(missed))
            if missed:
                line += "; missed at " + ", ".join("%s (%.2f×)" % (human(s), r) for s, r in missed)
            summary.append(line + ".")
        elif "strata" in missing:
            summary.append("%s, %s: strata not measured in this run (%s); Open MPI %s." % (
                coll, where, failed_log(o.out, "strata", coll, per_host),
                ", ".join("%s %.3f GB/s" % (human(s), rows_of["openmpi"][s]["busbw_gbs"])
                          for s in sizes if s in (4096, 1 << 20, 16 << 20, 64 << 20) and s in rows_of["openmpi"])))
        if bound:
            tops = [(s, max(rows_of[x].get(s, {}).get("busbw_gbs", 0) for x in SYSTEMS)) for s in sizes]
            big = [t for s, t in tops if s >= TARGET_FROM]
            if big and max(big) >= 0.6 * bound:
                summary.append("%s, %s: at ≥ 1 MiB the best system reaches %.0f%% of what the link allows "
                               "(%.2f GB/s busbw): the TCP path itself is the bottleneck there." % (
                                   coll, where, 100 * max(big) / bound, bound))
    if row_all:
        summary.append("%s, every size against issue 19's target (strata ≥ %g× Open MPI): %d of %d rows "
                       "meet it (%s)." % (where, ROW_TARGET, sum(row_met.values()), sum(row_all.values()),
                                          ", ".join("%s %d of %d" % (c, row_met[c], row_all[c])
                                                    for c in colls if c in row_all)))
    return L, summary


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--docs", default="docs")
    o = ap.parse_args()
    best, rounds, machine, link, bidir = load(o.out)
    hosts = int(machine.get("hosts", 2))
    # Most ranks per host first: the layout the issues' targets were set on.
    layouts = sorted({k[2] for k in best}, reverse=True) or [int(p) for p in machine.get("layouts", [2])]
    colls = [c for c in COLL_ORDER if any(k[1] == c for k in best)] or list(ISSUE4)
    # What the veth carries per direction while both directions are busy, as they are in both
    # collectives (and their TCP work shares the same cores): the best bidirectional probe,
    # per direction the mean of the two. Without one, the best one-way probe.
    link_gbs = max(((f + r) / 2 for f, r in bidir), default=None) or \
        max((max(v) for v in link.values()), default=None)
    link_what = "2 streams each way at once, per direction" if bidir else "one way, best of 1 and 2 streams"
    where = " and ".join("%d × %d" % (hosts, p) for p in layouts)

    L = ["# Strata between hosts: performance", "",
         "Generated by `scripts/perf_multihost_report.py` from one run of", "",
         "    %s" % machine.get("command", "scripts/bench_multihost.sh"), "",
         "on %s (%s CPUs, Linux %s), %s; git %s; load average %s at the start, %s at the end; %s s. "
         "Hosts are network namespaces on this one machine (`tests/multihost/netns_lib.sh`): hosts × ranks "
         "per host %s, one veth per host into a bridge (TCP between hosts, shared memory within a host). "
         "%s. "
         "The machine is shared and noisy: compare ratios measured in this run, not absolute figures."
         % (machine.get("cpu", "?"), machine.get("nproc", "?"), machine.get("kernel", "?"),
            machine.get("date", "?"), machine.get("git", "?"), machine.get("loadavg_start", "?"),
            machine.get("loadavg_end", "?"), machine.get("seconds", "?"), where,
            "; ".join(cores_line(hosts, p, machine.get("nproc")) for p in layouts).capitalize()), "",
         "Method: fp32, out of place, nccl-tests definitions (all_reduce busbw = algbw × 2(n−1)/n, "
         "all_to_all, all_gather, reduce_scatter busbw = algbw × (n−1)/n with size the whole buffer, "
         "broadcast busbw = algbw; barrier: time only); per size the median of the repeats, each the slowest "
         "rank's; the median of %s round(s) per system, layout and size (the lower one of an even number), systems and layouts alternating "
         "within a round. "
         "strata: `strata run --nnodes %d` with one agent per namespace, ranks running "
         "`strata bench --as-rank`, default settings (so data messages of 512 KiB or more travel in pieces "
         "over 4 TCP connections per peer: `STRATA_UCX_LANES`). Open MPI (%s): `mpirun` from h0, daemons started in the namespaces by "
         "`tests/multihost/mpi_rsh_agent.sh` (`--mca plm_rsh_agent`), `btl tcp,vader,self` with "
         "`btl_tcp_if_include`/`oob_tcp_if_include` = the test subnet, `mpi_yield_when_idle 1` (the ranks "
         "share this machine's cores; without it Open MPI busy-polls and a 4 KiB all_reduce takes ~10 ms "
         "instead of ~0.1 ms here), `bench/peers/mpi_bench`."
         % (max((len(v) for v in rounds.values()), default=1), hosts,
            machine.get("openmpi", "?")), ""]

    L += ["## The link", ""]
    if link or bidir:
        L += ["TCP over the same veth and bridge, iperf3 between h1 and h0 (%s), once per round:"
              % machine.get("iperf3", "iperf3"), "", md_row(["probe", "GB/s per round", "best"]), md_rule("lll")]
        for s in sorted(link):
            L.append("| %d stream%s, h1 → h0 | %s | %.2f |" % (s, "s" if s > 1 else "",
                                                            " / ".join("%.2f" % v for v in link[s]), max(link[s])))
        if bidir:
            L.append("| 2 streams each way at once (two iperf3 pairs), h1 → h0 + h0 → h1 | %s | %.2f per direction |" % (
                " / ".join("%.2f + %.2f" % fr for fr in bidir), link_gbs))
        L += ["", "What the link allows (busbw if only the link limited it, at %.2f GB/s per direction per host "
              "(%s; all_reduce and all_to_all send both ways at once, and the TCP work of both directions "
              "shares this machine's cores); all_reduce: each host sends 2(H−1)/H × size over its link, "
              "all_to_all P(n−P)/n × size, all_gather and reduce_scatter (H−1)P/n × size): %s." % (
                  link_gbs, link_what, "; ".join(
                      "%d × %d: %s" % (hosts, p, ", ".join("%s %.2f GB/s" % (c, link_bound_busbw(c, link_gbs, hosts, p))
                                                          for c in colls if link_bound_busbw(c, link_gbs, hosts, p)))
                      for p in layouts)), ""]
    else:
        L += ["Not measured (iperf3 missing or failed; see the logs).", ""]

    summary = []
    for p in layouts:
        lines, summ = layout_tables(o, best, colls, hosts, p, link_gbs)
        L += lines
        summary += summ

    os.makedirs(o.docs, exist_ok=True)
    plot = plot_png(best, colls, link_gbs, hosts, layouts, o.docs)
    if plot:
        L += ["![busbw vs size](%s)" % os.path.basename(plot), ""]
    if link_gbs:
        summary.insert(0, "Link (TCP over the veth, iperf3, %s): %.2f GB/s." % (link_what, link_gbs))
    L += ["## Summary", "", SUMMARY_BEGIN] + ["- " + s for s in summary] + [SUMMARY_END, ""]

    path = os.path.join(o.docs, "PERFORMANCE_MULTIHOST.md")
    # The lanes section comes from its own script (scripts/bench_lanes.sh): kept as it was.
    lanes = between(read_text(path) or "", LANES_BEGIN, LANES_END)
    if lanes:
        L += [LANES_BEGIN] + lanes.splitlines() + [LANES_END, ""]
    write_lines(path, L)
    print("perf_multihost_report: wrote %s" % path)
    refresh_performance_md(o.docs)
    return 0


def plot_png(best, colls, link_gbs, hosts, layouts, docs):
    plt = pyplot("perf_multihost_report")
    if plt is None:
        return None
    colls = [c for c in colls if c != "barrier"]  # no busbw to draw
    fig, axes = plt.subplots(len(layouts), len(colls), figsize=(5.5 * len(colls), 4.2 * len(layouts)), squeeze=False)
    for row, p in zip(axes, layouts):
        for ax, coll in zip(row, colls):
            for s, style in (("strata", "o-"), ("openmpi", "s--")):
                rows = best.get((s, coll, p), {})
                if rows:
                    xs = sorted(rows)
                    ax.loglog(xs, [rows[x]["busbw_gbs"] for x in xs], style, label=s)
            bound = link_bound_busbw(coll, link_gbs, hosts, p) if link_gbs else None
            if bound:
                ax.axhline(bound, color="grey", ls=":", label="link bound (iperf3)")
            log_axes(ax, "size (bytes per rank)", "busbw (GB/s)",
                     "%s, %d hosts x %d rank%s" % (coll, hosts, p, "s" if p > 1 else ""))
            ax.legend()
    fig.tight_layout()
    path = os.path.join(docs, "perf_multihost.png")
    fig.savefig(path, dpi=100, bbox_inches="tight")
    return path


def section_lines(docs):
    """The "Between hosts" section of PERFORMANCE.md: a link and the summary of the last run."""
    text = read_text(os.path.join(docs, "PERFORMANCE_MULTIHOST.md")) or ""
    m = re.search(r"hosts × ranks per host (.+?), one veth", text)
    where = m.group(1) if m else "2 × 2"
    L = [SECTION_BEGIN, "## Between hosts", "",
         "strata vs Open MPI between network namespaces (hosts × ranks per host %s, TCP between hosts, shared "
         "memory within), %s 4 KiB–64 MiB, with the link's own TCP bandwidth: "
         "[PERFORMANCE_MULTIHOST.md](PERFORMANCE_MULTIHOST.md), measured by `scripts/bench_multihost.sh`."
         % (where, ", ".join(c for c in COLL_ORDER if "## %s," % c in text) or "all_reduce and all_to_all"), ""]
    summary = between(text, SUMMARY_BEGIN, SUMMARY_END)
    if summary:
        L += summary.splitlines() + [""]
    return L + [SECTION_END]


def refresh_performance_md(docs):
    path = os.path.join(docs, "PERFORMANCE.md")
    if replace_section(path, section_lines(docs), SECTION_BEGIN, SECTION_END):
        print("perf_multihost_report: refreshed the 'Between hosts' section of %s" % path)


if __name__ == "__main__":
    sys.exit(main())
