#!/usr/bin/env python3
"""Serving figures for MoE expert parallelism: examples/moe_serve (strata: Prefill + Decode
schedules; relay: the Relay baseline) and its Open MPI peer bench/peers/mpi_moe_serve
(MPI_Alltoallv of packed rows) at 2 and 4 ranks on this host and, with --multihost (root), on 2
network-namespace hosts x 1 and x 2 ranks (tests/multihost/netns_lib.sh: `strata run --nnodes 2`
agents, mpirun over the namespaces). Each case runs ROUNDS rounds of (strata job, Open MPI job);
a figure is the median over the rounds of that round's p50 or p99. Paths that sum in the same
order must give the same checksum at a rank count, wherever they ran (the runs stop otherwise);
across hosts the strata path sums per host (moe::Buffer::combine), so its bits differ from
relay's and Open MPI's there, and it is checked against the example's reference (--check).
Writes the section between <!-- serve-begin --> and <!-- serve-end --> of
docs/PERFORMANCE_MOE.md, keeping the rest of the file (scripts/moe_report.py keeps this section
in turn).

  /usr/bin/python3 scripts/bench_moe_serve.py [--build build] [--ranks 2,4] [--rounds 5] [--multihost]
  make bench-moe-serve                  # --multihost; MULTIHOST=0 for this host only (no root)
  /usr/bin/python3 scripts/bench_moe_serve.py --results DIR   # the document from earlier results
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report_common import cpu_model, md_table, read_text, replace_section  # noqa: E402

BEGIN = "<!-- serve-begin -->"
END = "<!-- serve-end -->"
PATHS = ["strata", "relay", "openmpi"]
ONE_HOST, TWO_HOSTS = "one host", "2 namespace hosts"
WHERE = [ONE_HOST, TWO_HOSTS]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MH_LIB = os.path.join(ROOT, "tests", "multihost", "netns_lib.sh")
# One job across 2 namespace hosts, through netns_lib.sh (fresh namespaces per job):
#   bash -c MH_JOB mh-job strata|openmpi PER_HOST DIR PROGRAM [ARGS...]
# strata: one `strata run --nnodes 2` agent per namespace (STRATA from the environment);
# openmpi: mpirun from h0 (mh_mpirun). UCX and Open MPI's TCP use the test link only.
MH_JOB = r"""
set -uo pipefail
source "$MH_LIB"
kind=$1 per=$2 dir=$3
shift 3
mh_setup 2 || exit 1
if [[ $kind == strata ]]; then
  STRATA_UCX_NET_DEVICES=eth0 mh_start_agents "$STRATA" "$per,$per" "$dir" --timeout 840s -- "$@"
  mh_wait_agents "$dir" 2 870 || echo "the agents did not finish within 870 s"
  rc=0
  for i in 0 1; do [[ $(mh_rc "$dir" $i) == 0 ]] || rc=1; done
  mh_show "$dir" 2
  exit $rc
fi
mh_mpirun 2 "$per" "$dir" 840 -x MALLOC_MMAP_THRESHOLD_ -x MALLOC_TRIM_THRESHOLD_ -- "$@"
"""
FIGS = [("ttft_ms_p50", "TTFT p50 ms"), ("ttft_ms_p99", "TTFT p99 ms"), ("tpot_ms_p50", "TPOT p50 ms"),
        ("tpot_ms_p99", "TPOT p99 ms")]
# The stream the figures use: the example's model defaults, more requests for the percentiles.
STREAM = ["--requests", "30", "--warmup", "2"]


def say(msg):
    sys.stderr.write("[bench_moe_serve %s] %s\n" % (time.strftime("%H:%M:%S"), msg))


def machine():
    return "%s, %d CPUs" % (cpu_model(), os.cpu_count() or 0)


def loadavg():
    return " ".join(read_text("/proc/loadavg", "? ? ?").split()[:3])


def multihost_ready():
    """'' when network-namespace hosts can be made here (root, iproute2...), else why not."""
    p = subprocess.run(["bash", "-c", 'source "$0"; mh_require', MH_LIB], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    return "" if p.returncode == 0 else (p.stdout.strip() or "exit %d" % p.returncode)


def run_job(cmd, env, log):
    with open(log, "w") as f:
        f.write("$ %s\n" % " ".join(cmd))
        f.flush()
        p = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=900)
    return p.returncode


def run_all(o, out):
    build = o.build
    strata, example = os.path.join(build, "strata"), os.path.join(build, "examples", "moe_serve")
    peer = os.path.join(build, "bench", "peers", "mpi_moe_serve")
    for p in (strata, example):
        if not os.access(p, os.X_OK):
            say("%s is not built (cmake --build %s --target strata_cli moe_serve)" % (p, build))
            return False
    mpirun = shutil.which("mpirun")
    have_mpi = bool(mpirun) and os.access(peer, os.X_OK) and not o.skip_mpi
    if not have_mpi:
        say("Open MPI path skipped (no mpirun or %s: scripts/install_bench_deps.sh, then rebuild)" % peer)
    # Strata waits as it does for a user (spin 500 us, yield, then sleep), unless STRATA_SPIN_US
    # is set. scripts/bench_moe.sh spins 100 ms to match Open MPI's polling; here, with other
    # jobs on the 2 cores, a rank that spins that long keeps the core its peer needs, and the
    # p99 figures measured the machine's load (TPOT p99 ~50 ms against ~2 ms with the default).
    senv = dict(os.environ)
    menv = dict(os.environ, MALLOC_MMAP_THRESHOLD_="4294967296", MALLOC_TRIM_THRESHOLD_="4294967296")
    mpi = [mpirun or "mpirun", "--oversubscribe", "-x", "MALLOC_MMAP_THRESHOLD_", "-x", "MALLOC_TRIM_THRESHOLD_"]
    if os.getuid() == 0:
        mpi.append("--allow-run-as-root")
    results = os.path.join(out, "results.jsonl")
    with open(os.path.join(out, "load_start"), "w") as f:
        f.write(loadavg())
    cases = [(ONE_HOST, n, None) for n in o.ranks]
    if o.multihost:
        # Across hosts every strata job also checks its outputs against the reference summed in
        # the Buffer's order (its checksum has no other path to agree with there). The agents
        # cannot see that both "hosts" share these cores: force the yielding wait when the
        # ranks outnumber them, as the automatic policy does on one host.
        mh_env = dict(senv, MH_LIB=MH_LIB, STRATA=os.path.abspath(strata))
        for per in o.per_host:
            over = 2 * per > (os.cpu_count() or 1) and "STRATA_OVERSUBSCRIBED" not in os.environ
            cases.append((TWO_HOSTS, 2 * per, (per, dict(mh_env, STRATA_OVERSUBSCRIBED="1") if over else mh_env)))
    for where, n, mh in cases:
        with open(os.path.join(out, "loads"), "a") as f:
            f.write("%s, %d ranks: %s\n" % (where, n, loadavg().split()[0]))
        for r in range(o.rounds):
            tag = "n%d_r%d" % (n, r) if mh is None else "mh%dx%d_r%d" % (2, mh[0], r)
            if mh is None:
                jobs = [("strata_" + tag, [strata, "run", "-n", str(n), example, "--path", "all"], senv, [])]
                if have_mpi:
                    jobs.append(("openmpi_" + tag, mpi + ["-np", str(n), peer], menv, []))
            else:
                per, env = mh
                d = os.path.join(out, "agents_" + tag)
                os.makedirs(d)
                job = ["bash", "-c", MH_JOB, "mh-job"]
                jobs = [("strata_" + tag, job + ["strata", str(per), d, os.path.abspath(example), "--path", "all"],
                         env, ["--check"])]
                if have_mpi:
                    jobs.append(("openmpi_" + tag, job + ["openmpi", str(per), d, os.path.abspath(peer)],
                                 dict(env, **{k: v for k, v in menv.items() if k.startswith("MALLOC_")}), []))
            for name, cmd, env, more in jobs:
                t0 = time.time()
                js = os.path.abspath(os.path.join(out, name + ".jsonl"))
                rc = run_job(cmd + STREAM + o.extra + more + ["--json", js], env, os.path.join(out, name + ".log"))
                if rc != 0:
                    say("%s FAILED (exit %d, %s)" % (name, rc, os.path.join(out, name + ".log")))
                    return False
                with open(js) as f, open(results, "a") as g:
                    for line in f:
                        g.write(json.dumps(dict(json.loads(line), round=r, where=where)) + "\n")
                say("%s ok (%.0f s)" % (name, time.time() - t0))
    with open(os.path.join(out, "load_end"), "w") as f:
        f.write(loadavg())
    with open(os.path.join(out, "machine"), "w") as f:
        f.write(machine())
    with open(os.path.join(out, "spin"), "w") as f:
        f.write(os.environ.get("STRATA_SPIN_US", ""))
    if o.multihost:
        with open(os.path.join(out, "multihost"), "w") as f:
            f.write(",".join(map(str, o.per_host)))
    return True


def load(results):
    rows = []
    with open(os.path.join(results, "results.jsonl")) as f:
        for line in f:
            if line.strip():
                # Results from before the cross-host rows: one host, every path k ascending.
                rows.append(dict({"where": ONE_HOST, "combine": "k", "checked": False}, **json.loads(line)))
    return rows


def check_agreement(rows):
    """'' when every path that sums in the same order gave one checksum per rank count (on one
    host and across hosts alike), and every path summing per host matched the reference; else
    what differs."""
    bad = []
    for n, order in sorted({(r["ranks"], r["combine"]) for r in rows}):
        sums = {(r["where"], r["path"], r["checksum"]) for r in rows if r["ranks"] == n and r["combine"] == order}
        if len({s for _, _, s in sums}) > 1:
            bad.append("%d ranks: %s" % (n, ", ".join("%s %s %s" % p for p in sorted(sums))))
    for r in rows:
        if r["combine"] != "k" and not r["checked"]:
            bad.append("%s, %d ranks, %s: summed per host but not checked against the reference" % (
                r["where"], r["ranks"], r["path"]))
            break
    return "; ".join(bad)


def summarise(rows):
    """{(where, ranks, path): {figure: median over rounds}}."""
    acc = {}
    for r in rows:
        d = acc.setdefault((r["where"], r["ranks"], r["path"]), {k: [] for k, _ in FIGS})
        for k, _ in FIGS:
            d[k].append(r[k])
    return {key: {k: statistics.median(v) for k, v in d.items()} for key, d in acc.items()}


def fms(x):
    return "%.2f" % x if x >= 10 else "%.3f" % x


def section_lines(rows, command, load_start, load_end, host, spin="", multihost="", loads=""):
    med = summarise(rows)
    rounds = len({r.get("round", 0) for r in rows})
    any_row = rows[0]
    cases = sorted({k[:2] for k in med}, key=lambda c: (WHERE.index(c[0]) if c[0] in WHERE else 9, c[1]))
    body = []
    for where, n in cases:
        base = med.get((where, n, "openmpi"))
        for p in PATHS:
            m = med.get((where, n, p))
            if not m:
                continue
            cells = [where, "%d" % n, p]
            for k, _ in FIGS:
                c = fms(m[k])
                if base and p != "openmpi" and m[k] > 0:
                    c += " (%.2f×)" % (base[k] / m[k])
                cells.append(c)
            body.append(cells)
    cfg = ("%d layers, hidden %d, ffn %d, %d experts, top-%d, bfloat16 rows; per request %d prompt tokens/rank, "
           "then %d decode steps of %d tokens/rank; %d timed requests (+ warm-up) per path and round, %d round%s"
           % (any_row["layers"], any_row["hidden"], any_row["ffn"], any_row["experts"], any_row["topk"],
              any_row["prompt"], any_row["decode_steps"], any_row["decode_tokens"], any_row["requests"], rounds,
              "" if rounds == 1 else "s"))
    L = [BEGIN, "## Serving: TTFT and TPOT (examples/moe_serve)", "",
         "Generated by `scripts/bench_moe_serve.py` from one run of:", "", "```sh", command, "```", "",
         "- Date: %s; machine: %s" % (time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), host),
         "- Load average at start / end: %s / %s — the machine is shared with other jobs and has 2 cores, so 4 "
         "ranks are oversubscribed; compare paths within one rank count, not absolute figures." % (
             load_start, load_end) + (" Load average (1 min) as each case started: %s." % "; ".join(
                 loads.splitlines()) if loads else ""),
         "- Model (`examples/moe_serve_model.hpp`): %s. Each layer: rmsnorm, router (hidden → experts matmul, "
         "softmax, top-k), dispatch, experts relu(x·W1)·W2 in place on the received rows, combine, residual add." % cfg,
         "- Paths: `strata` = `strata::moe::Buffer` with the Prefill schedule for the prefill and the Decode "
         "schedule for the decode steps (the recommended use); `relay` = the Relay baseline of the same library "
         "(pack, all_to_all_v, unpack) for both; `openmpi` = `bench/peers/mpi_moe_serve`: permute, "
         "`MPI_Alltoall` counts, `MPI_Alltoallv` of the packed rows, experts, `MPI_Alltoallv` back, fp32 "
         "weighted sum — an expert-parallel stack on MPI (Megatron's all-to-all dispatcher).",
         "- TTFT = the prefill forward through every layer; TPOT = one decode step through every layer; both "
         "the slowest rank's, after a barrier. p50/p99 over the stream of one round; the table gives the median "
         "over the rounds. In brackets: the Open MPI figure ÷ this path's (> 1× = faster than Open MPI). "
         "Strata and relay take turns request by request in one job; Open MPI runs as its own job right after. "
         "Waiting: strata %s; Open MPI polls (yielding the core when ranks outnumber cores)." % (
             "with `STRATA_SPIN_US=%s`" % spin if spin else
             "as it is for a user (`STRATA_SPIN_US` unset: spin 500 µs, yield, then sleep)"),
         "- Correctness: on one host every path's outputs are bit-identical (combine sums in fp32 in the order "
         "k = 0..K-1 on every path, and each expert row depends only on its input row), checked by a checksum per "
         "path and rank count; `Examples.moe_serve` also checks them against a single-process reference. Across "
         "hosts, see below the table.",
         "- Reading: at these sizes a step is mostly the experts' and router's matmuls, the same code on "
         "every path, and the dispatch/combine rows are a few KiB per layer; so on a loaded machine the "
         "differences are mostly how each path waits for its peers, not how it moves the rows: Open MPI "
         "polls without sleeping at 2 ranks (short waits end sooner: lower TPOT p50), strata spins 500 µs "
         "then yields and sleeps, leaving the core to the peer it waits for and to the other jobs.", "",
         ] + md_table(["where", "ranks", "path"] + [h for _, h in FIGS], body, "lllrrrr") + [""]
    if any(r["where"] == TWO_HOSTS for r in rows):
        L += ["2 namespace hosts (`--multihost`, root): the hosts are network namespaces on this one machine "
              "(`tests/multihost/netns_lib.sh`), 2 hosts × %s rank(s) each, one veth per host into a bridge: TCP "
              "between hosts, shared memory within a host, every rank on the same 2 cores as above. strata and "
              "relay: `strata run --nnodes 2`, one agent per namespace, UCX on the test link "
              "(`STRATA_UCX_NET_DEVICES=eth0`), `STRATA_OVERSUBSCRIBED=1` where the ranks outnumber the cores "
              "(the agents cannot see that both hosts share them); Open MPI: mpirun from h0 over the namespaces "
              "(`tests/multihost/mpi_rsh_agent.sh`), `btl tcp,vader,self` on the test subnet, "
              "`mpi_yield_when_idle 1`. Correctness there: relay and Open MPI sum k ascending and give the same "
              "checksum as every path on one host at that rank count; the strata path's Buffer sums per host "
              "(each other host's terms come back as one partial sum rounded to bfloat16, "
              "`moe::Buffer::combine`), so its outputs differ in the last bits by design, and every strata job "
              "across hosts runs with `--check`: each output equals the example's reference summed in that "
              "order, bit for bit (the reference runs outside the timed steps: after a step's time is taken, before the "
              "next barrier). The TCP link between namespaces is a kernel copy, not a NIC: the "
              "cross-host rows show the cost of the paths' protocols and waits, not of a real network."
              % (multihost or "1 and 2")]
    else:
        L += ["Between hosts: not measured in this run (`--multihost` needs root for the network-namespace "
              "hosts; `make bench-moe-serve` runs it)."]
    return L + [END]


def write_doc(results, docs, command):
    rows = load(results)
    if not rows:
        say("no results in %s" % results)
        return 1
    diff = check_agreement(rows)
    if diff:
        say("paths disagree: %s" % diff)
        return 1
    path = os.path.join(docs, "PERFORMANCE_MOE.md")
    lines = section_lines(rows, command, read_text(os.path.join(results, "load_start"), "?"),
                          read_text(os.path.join(results, "load_end"), "?"),
                          read_text(os.path.join(results, "machine"), machine()),
                          read_text(os.path.join(results, "spin")),
                          read_text(os.path.join(results, "multihost")).replace(",", " and "),
                          read_text(os.path.join(results, "loads")))
    if not replace_section(path, lines, BEGIN, END):
        with open(path, "w") as f:
            f.write("# Strata performance: MoE dispatch and combine\n\n" + "\n".join(lines) + "\n")
    print("bench_moe_serve: wrote the serving section of %s" % path)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.environ.get("BUILD_DIR", "build"))
    ap.add_argument("--docs", default="docs")
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=None, help="results directory (default BUILD/bench-moe-serve)")
    ap.add_argument("--results", default=None, help="write the document from these results, run nothing")
    ap.add_argument("--skip-mpi", action="store_true")
    ap.add_argument("--multihost", action="store_true",
                    help="also across 2 network-namespace hosts (root; tests/multihost/netns_lib.sh)")
    ap.add_argument("--per-host", default="1,2", help="ranks per namespace host with --multihost")
    ap.add_argument("extra", nargs="*", help="more options for moe_serve and its peer (after --)")
    o = ap.parse_args()
    o.ranks = [int(x) for x in o.ranks.split(",") if x]
    o.per_host = [int(x) for x in o.per_host.split(",") if x]
    command = "make bench-moe-serve"
    if o.results:
        return write_doc(o.results, o.docs, command)
    if o.multihost:
        why = multihost_ready()
        if why:
            say("--multihost: %s (MULTIHOST=0 make bench-moe-serve, or no --multihost, for this host only)" % why)
            return 1
    out = o.out or os.path.join(o.build, "bench-moe-serve")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    if not run_all(o, out):
        return 1
    if o.ranks != [2, 4] or o.rounds != 5 or o.extra or not o.multihost or o.per_host != [1, 2]:
        command = "/usr/bin/python3 scripts/bench_moe_serve.py --ranks %s --rounds %d%s%s" % (
            ",".join(map(str, o.ranks)), o.rounds,
            (" --multihost --per-host %s" % ",".join(map(str, o.per_host))) if o.multihost else "",
            (" -- " + " ".join(o.extra)) if o.extra else "")
    return write_doc(out, o.docs, command)


if __name__ == "__main__":
    sys.exit(main())
