#!/usr/bin/env python3
"""Recovery across hosts: `strata run --ft --nnodes H` between network namespaces.

Runs examples/train_dp with 2 ranks per host on 2 and 3 namespace hosts (real UCX over TCP
between them, tests/multihost/netns_lib.sh) and measures, per case, the median of --repeats
runs:
  - rank loss: a rank on the last host SIGKILLed; detection, RTO and its breakdown as rank 0
    reports them, and whether the final parameters equal the run without a failure;
  - hot spare: the same with `--spares 1` on every host;
  - host loss: the last host's agent and all its ranks SIGKILLed (train_dp --fail R:S:host)
    with no spare host; the time from the loss until every survivor's agent has exited with
    the error naming the lost host (--ft's agent timeout is 1 s);
  - host loss with a spare host (`strata run --ft --spare`), and node 0 lost with the store
    outside the job (`strata store`, --external-store): RTO and breakdown as for a rank.
It rewrites only the section of --out (docs/RECOVERY.md) between <!-- mh-begin --> and
<!-- mh-end -->, which scripts/bench_recovery.py keeps. Needs root (network namespaces).

  /usr/bin/python3 scripts/bench_recovery_multihost.py --build build
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIB = os.path.join(ROOT, "tests", "multihost", "netns_lib.sh")
BEGIN, END = "<!-- mh-begin -->", "<!-- mh-end -->"


def job(build, hosts, run_opts, train_opts, env, spare=False, external=False):
    """One job on `hosts` namespace hosts of 2 ranks (plus a spare host, plus a host serving the
    store outside the job); returns (logdir, rc per host, end per host)."""
    log = tempfile.mkdtemp(prefix="strata-mhrec.")
    counts = ",".join(["2"] * hosts)
    spare_host, store_host = hosts, hosts + (1 if spare else 0)
    ext = "--external-store" if external else ""
    script = f"""
source {LIB}
mh_require
mh_setup {store_host + (1 if external else 0)} || exit 1
trap mh_cleanup EXIT
MH_TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \\n')
export MH_TOKEN
if [[ -n "{ext}" ]]; then MH_STORE_ADDR=$(mh_start_store {build}/strata {store_host}); export MH_STORE_ADDR; sleep 0.3; fi
mh_start_agents {build}/strata {counts} {log} --ft {ext} --timeout 60s {run_opts} -- {build}/examples/train_dp {train_opts}
if [[ "{spare}" == True ]]; then
  mh_start_spare {build}/strata {spare_host} {log} {ext} -n 2 --timeout 60s -- {build}/examples/train_dp {train_opts}
fi
mh_wait_agents {log} {hosts + (1 if spare else 0)} 70
"""
    subprocess.run(["bash", "-c", script], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=120, check=False)
    rcs, ends = [], []
    for i in range(hosts + (1 if spare else 0)):
        try:
            with open(os.path.join(log, f"h{i}.rc")) as f:
                rc, end = f.read().split()
            rcs.append(int(rc))
            ends.append(float(end))
        except (OSError, ValueError):
            rcs.append(None)
            ends.append(None)
    return log, rcs, ends


def read(log, name):
    try:
        with open(os.path.join(log, name)) as f:
            return f.read()
    except OSError:
        return ""


RECOVERED = re.compile(r"recovered epoch \d+ \(replaced rank [\d,]+\): detection ([\d.]+) ms, RTO ([\d.]+) ms = "
                       r"detect ([\d.]+) \+ revoke ([\d.]+) \+ join ([\d.]+) \(replacement spawned after [-\d.]+\) \+ "
                       r"rebuild ([\d.]+) \+ state transfer ([\d.]+) \+ redone step ([\d.]+) ms")
HASH = re.compile(r"final params hash ([0-9a-f]+)")


def measure(rows, hosts, case, want, repeats, run_job, outputs):
    """Runs a failure case `repeats` times (run_job() -> (log, rcs, ends)) and appends the
    medians of rank 0's recovery report, and whether every run ended with the parameters
    `want`, to rows. Rank 0 reports from any of the first `outputs` hosts (a spare host's too)."""
    got, same = [], True
    for _ in range(repeats):
        log, rcs, _ = run_job()
        out = "".join(read(log, f"h{i}.out") for i in range(outputs))
        m = RECOVERED.search(out)
        h = HASH.search(out)
        same = same and h is not None and h.group(1) == want and all(rc in (0, 137) for rc in rcs)
        if m:
            got.append([float(x) for x in m.groups()])
    if got:
        med = [statistics.median(col) for col in zip(*got)]
        rows.append((hosts, case, med, same, len(got)))
        print(hosts, case, med, same, file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--hosts", default="2,3")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--fail-step", type=int, default=8)
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "RECOVERY.md"))
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench_recovery_multihost: needs root (network namespaces)")
    build = os.path.abspath(a.build)
    env = dict(os.environ, STRATA_UCX_NET_DEVICES="eth0", STRATA_TIMEOUT="15s")
    train = f"--steps {a.steps} --hidden 1024"
    rows = []
    for hosts in [int(h) for h in a.hosts.split(",")]:
        last = 2 * hosts - 1  # a rank of the last host
        clean_log, _, _ = job(build, hosts, "", train, dict(env, STRATA_AGENT_TIMEOUT="5s"))
        want = HASH.search(read(clean_log, "h0.out"))
        want = want.group(1) if want else None
        for case, run_opts, extra in (("rank loss", "", f"--fail {last}:{a.fail_step}"),
                                      ("rank loss, hot spare", "--spares 1", f"--fail {last}:{a.fail_step} --pace 20")):
            measure(rows, hosts, case, want, a.repeats,
                    lambda: job(build, hosts, run_opts, f"{train} {extra}", dict(env, STRATA_AGENT_TIMEOUT="5s")), 1)
        lost = []
        for _ in range(a.repeats):
            log, rcs, ends = job(build, hosts, "", f"{train} --fail {last}:{a.fail_step}:host", env)
            err = read(log, "h0.out") + read(log, "h0.err")
            named = f"lost with it: ranks {last - 1}-{last}" in err and "the job cannot recover" in err
            if ends[-1] and all(e for e in ends[:-1]) and named:
                lost.append(max(ends[:-1]) - ends[-1])
        if lost:
            rows.append((hosts, "host loss, no spare host", [statistics.median(lost) * 1000], True, len(lost)))
            print(hosts, "host loss", lost, file=sys.stderr)
        # A whole host lost with a spare host waiting: its ranks start again there. The last
        # host, then node 0 itself with the store outside the job (`strata store`).
        for case, fail, external in (("host loss, spare host", f"{last}:{a.fail_step}:host", False),
                                     ("node 0 lost, spare host, external store", f"0:{a.fail_step}:host", True)):
            measure(rows, hosts, case, want, a.repeats,
                    lambda: job(build, hosts, "", f"{train} --pace 40 --fail {fail}",
                                env, spare=True, external=external), hosts + 1)
    write_doc(a, rows)


def write_doc(a, rows):
    L = [BEGIN, "", "## Across hosts (network namespaces)", "",
         f"`/usr/bin/python3 scripts/bench_recovery_multihost.py --hosts {a.hosts} --repeats {a.repeats}` "
         "(part of `make bench-recovery`; needs root). train_dp with 2 ranks per namespace host, real UCX over TCP "
         "between the namespaces, all on this 2-core machine; medians of the runs, in ms. A rank of the last host is "
         f"SIGKILLed at step {a.fail_step}; every other rank keeps its process. \"same params\": the final parameters "
         "equal the run without a failure, in every run. The hot-spare runs pace every step by 20 ms "
         "(`--pace 20`, so that the spares are waiting before the failure), the spare-host runs by 40 ms: their "
         "redone step contains it. Host loss with a spare host: the last host's agent and both its ranks "
         "SIGKILLed (`train_dp --fail R:S:host`); `strata run --ft --spare` waits on an extra namespace host and "
         "takes the lost host's ranks once its agent has been silent for --ft's agent timeout (0.75 s by default, "
         "beats every 94 ms: most of the detection). With `--external-store` the store runs outside the job (`strata store` on one more "
         "namespace host), so node 0 itself can be lost; rank 0 then reports from the spare host.", "",
         "| hosts | ranks | case | runs | detection | RTO | detect | join | rebuild | state transfer | redone step | same params |",
         "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for hosts, case, med, same, n in rows:
        if len(med) == 1:
            continue
        det, rto, detect, _revoke, join, rebuild, xfer, redo = med
        L.append(f"| {hosts} | {2 * hosts} | {case} | {n} | {det:.1f} | {rto:.1f} | {detect:.1f} | {join:.1f} | "
                 f"{rebuild:.1f} | {xfer:.1f} | {redo:.1f} | {'yes' if same else 'NO'} |")
    L += ["", "A whole host lost (`train_dp --fail R:S:host`: its agent and both its ranks SIGKILLed) with no spare "
          "host: the time from the loss until every other host's agent has exited, each of their ranks having "
          "failed with an error naming the lost host and its ranks (--ft's agent timeout is 0.75 s; the target is 5 s).",
          "", "| hosts | ranks | runs | loss → every survivor ended with the error (ms) |", "|---:|---:|---:|---:|"]
    for hosts, case, med, same, n in rows:
        if len(med) == 1:
            L.append(f"| {hosts} | {2 * hosts} | {n} | {med[0]:.0f} |")
    L += ["", END]
    section = "\n".join(L) + "\n"
    try:
        with open(a.out) as f:
            doc = f.read()
    except OSError:
        doc = ""
    b = doc.find(BEGIN)
    e = doc.find(END, b) if b >= 0 else -1
    doc = doc[:b] + section.rstrip("\n") + doc[e + len(END):] if e >= 0 else doc.rstrip("\n") + "\n\n" + section
    with open(a.out, "w") as f:
        f.write(doc)
    print(f"wrote {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
