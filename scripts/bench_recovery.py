#!/usr/bin/env python3
"""Recovery figures for docs/RECOVERY.md, from one run.

For N ranks on this host, runs examples/train_dp three times per repeat:
  - strata: `strata run --ft` kills rank 1 at step FAIL_STEP; the controller replaces only
    that rank, survivors recover() and the replacement restores from a replica;
  - strata with hot spares: the same with `--spares 1`: the rank goes to a process already
    waiting in strata::init() instead of a new one;
  - baseline: `strata run --ft --restart-all` with a checkpoint written every K steps; the
    kill restarts every rank, which reload the checkpoint and redo the lost steps.
Detection = kill -> every survivor has seen the revoke. RTO = kill -> the interrupted step
completed again (for strata the redone step; for the baseline after the lost steps too).

  scripts/bench_recovery.py [--ranks 4,8,16,32,64] [--repeats 3] [--build build] [--no-baseline]

It rewrites --out (docs/RECOVERY.md) except the PyTorch section between <!-- ddp-begin --> and
<!-- ddp-end -->, which scripts/bench_ddp_recovery.py writes (make bench-recovery-torch), and the
section across hosts between <!-- mh-begin --> and <!-- mh-end -->, which
scripts/bench_recovery_multihost.py writes.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report_common import log_axes, md_row, md_rule, pyplot, write_lines  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd, env=None, timeout=600):
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    return p.returncode, p.stdout, p.stderr, time.time() - t0


def kv(line):
    return {k: int(v) for k, v in re.findall(r"(\w+)=(-?\d+)", line)}


def strata_once(build, n, steps, fail_step, hidden, env, spares=0):
    cmd = [f"{build}/strata", "run", "--ft", "--spares", str(spares), "-n", str(n), "--",
           f"{build}/examples/train_dp", "--steps", str(steps),
           "--hidden", str(hidden), "--times", "--fail", f"1:{fail_step}:kill"]
    rc, out, err, _ = run(cmd, env)
    if rc != 0:
        raise RuntimeError(f"strata run failed (rc {rc}):\n{err[-3000:]}")
    recs = [kv(l) for l in out.splitlines() if "RECOVERY rank=" in l]
    survivors = [r for r in recs if r["replacement"] == 0]
    repl = [r for r in recs if r["replacement"] == 1]
    r0 = next(r for r in survivors if r["rank"] == 0)
    inj = r0["injected"]
    ms = lambda a, b: (b - a) / 1e6
    return {
        "step": normal_step(out, fail_step),
        "detect_all": ms(inj, max(r["seen"] for r in survivors)),
        "rto": ms(inj, r0["step_done"]),
        "detect": ms(inj, r0["detected"]),
        "spawn": ms(r0["detected"], r0["spawned"]),
        "replacement_start": ms(r0["spawned"], repl[0]["seen"]) if repl else float("nan"),
        "join": ms(r0["rebuild_start"], r0["joined"]),
        "rebuild": ms(r0["joined"], r0["rebuilt"]),
        "state": ms(r0["rebuilt"], r0["restored"]),
        "redo": ms(r0["restored"], r0["step_done"]),
        "bytes": max(r["bytes"] for r in recs),
    }


def normal_step(out, fail_step):
    """Median time of one step before the failure (rank 0's STEP_DONE lines, the first step
    left out as warm-up): what the redone step costs with nothing to recover."""
    done = {}
    for l in out.splitlines():
        if "STEP_DONE step=" in l:
            d = kv(l)
            done.setdefault(d["step"], d["t"])
    gaps = [(done[s] - done[s - 1]) / 1e6 for s in range(2, fail_step) if s in done and s - 1 in done]
    return statistics.median(gaps) if gaps else float("nan")


def cost_once(build, n, env):
    """The cost of one recovery, counted: idle ranks (hidden 16, 4 steps), rank 1 killed at step 2."""
    cmd = [f"{build}/strata", "run", "--ft", "-n", str(n), "--", f"{build}/examples/train_dp", "--steps", "4",
           "--hidden", "16", "--quiet", "--times", "--fail", "1:2:kill"]
    rc, out, err, _ = run(cmd, env)
    if rc != 0:
        raise RuntimeError(f"strata run failed (rc {rc}):\n{err[-3000:]}")
    recs = [kv(l) for l in out.splitlines() if "RECOVERY rank=" in l]
    surv = [r for r in recs if r["replacement"] == 0 and r["rank"] != 0]
    r0 = next(r for r in recs if r["rank"] == 0)
    repl = next(r for r in recs if r["replacement"] == 1)
    m = re.search(r"controller's cost of this failure: (\d+) store requests, (\d+) bytes", err)
    keys = ("store_ops", "store_bytes", "peer_waits", "agree_bytes")
    return {"n": n, "surv_max": {k: max(r[k] for r in surv) for k in keys},
            "surv_median": {k: statistics.median(r[k] for r in surv) for k in keys},
            "r0": {k: r0[k] for k in keys}, "repl": {k: repl[k] for k in keys},
            "ctl_ops": int(m.group(1)) if m else -1, "ctl_bytes": int(m.group(2)) if m else -1}


def baseline_once(build, n, steps, fail_step, hidden, every, env):
    ckpt = f"/tmp/strata-bench-ckpt-{os.getpid()}-{n}"
    for f in (ckpt, ckpt + ".tmp"):
        if os.path.exists(f):
            os.remove(f)
    cmd = [f"{build}/strata", "run", "--ft", "--restart-all", "--max-failures", "1", "-n", str(n), "--",
           f"{build}/examples/train_dp", "--steps", str(steps), "--hidden", str(hidden), "--checkpoint", ckpt,
           "--checkpoint-every", str(every), "--times", "--fail", f"1:{fail_step}:kill"]
    rc, out, err, _ = run(cmd, env)
    for f in (ckpt, ckpt + ".tmp"):
        if os.path.exists(f):
            os.remove(f)
    if rc != 0:
        raise RuntimeError(f"baseline failed (rc {rc}):\n{err[-3000:]}")
    lines = out.splitlines()
    inj = next(kv(l)["t"] for l in lines if "INJECT rank=" in l)
    loaded = [i for i, l in enumerate(lines) if "CKPT_LOADED" in l]
    if not loaded:
        raise RuntimeError("baseline did not reload a checkpoint:\n" + out[-2000:])
    after = lines[loaded[-1]:]
    t_load = kv(lines[loaded[-1]])["t"]
    done = next(kv(l)["t"] for l in after if f"STEP_DONE step={fail_step} " in l + " ")
    return {"rto": (done - inj) / 1e6, "reload": (t_load - inj) / 1e6, "lost": fail_step - kv(lines[loaded[-1]])["step"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="4,8,16,32,64")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--fail-step", type=int, default=8)
    ap.add_argument("--checkpoint-every", type=int, default=5)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--light-hidden", type=int, default=64,
                    help="hidden size of the hot-spare runs whose step costs little (0: skip them)")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "RECOVERY.md"))
    ap.add_argument("--no-baseline", action="store_true", help="skip the restart-all runs (the slowest)")
    ap.add_argument("--cost-ranks", default="4,16,64,256", help="job sizes of the counted-cost table")
    a = ap.parse_args()
    a.load_before = others_load()
    env = dict(os.environ)
    ranks = [int(x) for x in a.ranks.split(",")]
    rows = []
    for n in ranks:
        s_runs, h_runs, b_runs, l_runs = [], [], [], []
        for i in range(a.repeats):
            s_runs.append(strata_once(a.build, n, a.steps, a.fail_step, a.hidden, env))
            h_runs.append(strata_once(a.build, n, a.steps, a.fail_step, a.hidden, env, spares=1))
            if a.light_hidden:
                l_runs.append(strata_once(a.build, n, a.steps, a.fail_step, a.light_hidden, env, spares=1))
            if not a.no_baseline:
                b_runs.append(baseline_once(a.build, n, a.steps, a.fail_step, a.hidden, a.checkpoint_every, env))
            print(f"N={n} run {i + 1}/{a.repeats}: strata RTO {s_runs[-1]['rto']:.0f} ms, with a hot spare "
                  f"{h_runs[-1]['rto']:.0f} ms" + (f", baseline RTO {b_runs[-1]['rto']:.0f} ms" if b_runs else ""),
                  file=sys.stderr, flush=True)
        med = lambda runs, k: statistics.median(r[k] for r in runs)
        nan = float("nan")
        rows.append({"n": n, **{k: med(s_runs, k) for k in s_runs[0]},
                     "hot": {k: med(h_runs, k) for k in h_runs[0]},
                     "light": {k: med(l_runs, k) for k in l_runs[0]} if l_runs else None,
                     "base_rto": med(b_runs, "rto") if b_runs else nan,
                     "base_reload": med(b_runs, "reload") if b_runs else nan,
                     "lost": b_runs[0]["lost"] if b_runs else 0})
    costs = []
    for n in [int(x) for x in a.cost_ranks.split(",") if x]:
        costs.append(cost_once(a.build, n, env))
        print(f"N={n}: counted cost {costs[-1]}", file=sys.stderr, flush=True)
    write_doc(a, rows, costs)


def others_load():
    """1-minute load average before this script's runs, to say how busy the machine was."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


def write_doc(a, rows, costs):
    cmd = "make bench-recovery   # = /usr/bin/python3 scripts/bench_recovery.py" + \
        (f" --ranks {a.ranks}" if a.ranks != "4,8,16,32,64" else "") + \
        (f" --repeats {a.repeats}" if a.repeats != 3 else "") + (" --no-baseline" if a.no_baseline else "") + \
        (f" --cost-ranks {a.cost_ranks}" if a.cost_ranks != "4,16,64,256" else "") + \
        (f" --light-hidden {a.light_hidden}" if a.light_hidden != 64 else "")
    state_kib = rows[0]["bytes"] / 1024
    L = []
    L.append("# Failure recovery: measured\n")
    L.append("Generated by `scripts/bench_recovery.py`; reproduce with:\n")
    L.append(f"```sh\n{cmd}\n```\n")
    L.append(f"One host (2 cores, shared with other work: load average {a.load_before:.1f} when the script "
             f"started), N ranks of `examples/train_dp` (an MLP, hidden {a.hidden}; "
             f"{state_kib:.0f} KiB of registered state per rank: parameters, momentum, step, data cursor, RNG), "
             f"{a.steps} steps, rank 1 SIGKILLed at step {a.fail_step}. Medians of {a.repeats} runs per row, "
             "all rows from one run of the script. Times in ms.\n")
    L.append("- **detection**: kill → every survivor has seen the revoke (its pending collective fails with "
             "PeerFailed).\n- **RTO**: kill → the interrupted step completed again on rank 0.\n"
             "- breakdown (rank 0's view): *detect* kill → controller noticed; *spawn* controller noticed → "
             "replacement started (with a hot spare: → the rank handed to the spare); *start* → the "
             "replacement's init began its join (with a hot spare: the spare woke in `strata::init()`); "
             "*join* rank 0 began rebuilding → every rank arrived (includes the replacement's start-up); "
             "*rebuild* → world communicator usable; *state* restore from a replica; *redo* the redone step.\n"
             "- **hot spare**: `strata run --ft --spares 1`: one process started with the job runs the program "
             "up to `strata::init()` and waits there; the failed rank goes to it.\n")
    if not a.no_baseline:
        L.append(f"- **baseline**: `strata run --ft --restart-all`: every rank killed and restarted under a new "
                 f"job, checkpoint written every {a.checkpoint_every} steps reloaded, {rows[0]['lost']} lost steps "
                 "redone (kill → the interrupted step completed again).\n")

    def breakdown(r):
        return (f"{r['detect']:.1f} | {r['spawn']:.1f} | {r['replacement_start']:.1f} | {r['join']:.1f} | "
                f"{r['rebuild']:.1f} | {r['state']:.1f} | {r['redo']:.1f} | {r['step']:.1f}")

    L.append("- *step*: one step before the failure (median of rank 0's, the first left out), i.e. what the "
             "redone step costs with nothing to recover. On 2 cores it grows with N: every rank computes its "
             "own gradients, so N ranks' compute shares 2 cores.\n")

    L.append("### Replacement started after the failure (`--ft`)\n")
    head = ["ranks", "detection", "RTO", "detect", "spawn", "start", "join", "rebuild", "state", "redo", "step"]
    if not a.no_baseline:
        head += ["baseline RTO", "baseline / strata"]
    L.append(md_row(head))
    L.append(md_rule("r" * len(head)))
    for r in rows:
        line = f"| {r['n']} | {r['detect_all']:.1f} | {r['rto']:.1f} | {breakdown(r)} |"
        if not a.no_baseline:
            line += f" {r['base_rto']:.0f} | {r['base_rto'] / r['rto']:.1f}× |"
        L.append(line)
    L.append("")
    L.append("### Hot spare (`--ft --spares 1`)\n")
    L.append(md_row(["ranks", "detection", "RTO", "detect", "spawn", "start", "join", "rebuild", "state", "redo",
                     "step", "RTO without spare / with"]))
    L.append(md_rule("r" * 12))
    for r in rows:
        h = r["hot"]
        L.append(f"| {r['n']} | {h['detect_all']:.1f} | {h['rto']:.1f} | {breakdown(h)} | {r['rto'] / h['rto']:.2f}× |")
    first, last = rows[0], rows[-1]
    L.append("")
    L.append(f"RTO({last['n']}) / RTO({first['n']}): {last['rto'] / first['rto']:.2f} without a spare, "
             f"{last['hot']['rto'] / first['hot']['rto']:.2f} with a hot spare (target ≤ 1.5); with a hot spare "
             f"RTO({first['n']}) = {first['hot']['rto']:.1f} ms (target ≤ 30 ms). 0 steps lost in every strata run "
             "(the final parameters are bit-identical to a run without failure: `tests/recovery/recovery_test.cpp` "
             "checks this for every fault kind, with and without spares).\n")
    hot_less = [r["hot"]["rto"] - r["hot"]["step"] for r in (first, last)]
    L.append(f"The redone step is one step of the job, and at {last['n']} ranks on 2 cores one step alone takes "
             f"{last['hot']['step']:.1f} ms ({first['hot']['step']:.1f} ms at {first['n']}). Less one step, the "
             f"hot-spare RTO is {hot_less[0]:.1f} ms at {first['n']} ranks and {hot_less[1]:.1f} ms at {last['n']}: "
             f"{hot_less[1] / hot_less[0]:.2f}×.\n")
    if first.get("light"):
        L.append(f"### Hot spare, light step (`--hidden {a.light_hidden}`)\n")
        L.append(f"The same runs with hidden {a.light_hidden}, so that the redone step costs little and the RTO is "
                 "mostly recovery itself: detection, hand-off to the spare, the join, the state transfer.\n")
        L.append(md_row(["ranks", "detection", "RTO", "detect", "spawn", "start", "join", "rebuild", "state", "redo",
                         "step"]))
        L.append(md_rule("r" * 11))
        for r in rows:
            h = r["light"]
            L.append(f"| {r['n']} | {h['detect_all']:.1f} | {h['rto']:.1f} | {breakdown(h)} |")
        L.append("")
        L.append(f"RTO({last['n']}) / RTO({first['n']}) with a light step: "
                 f"{last['light']['rto'] / first['light']['rto']:.2f} (target ≤ 1.5).\n")
    if costs:
        L.append("### The cost of one recovery, counted\n")
        L.append("Idle ranks (`examples/train_dp --hidden 16 --steps 4`, rank 1 SIGKILLed at step 2, no spare); "
                 "counts are deterministic, not timed, from the start of the rebuild to the end of the restore "
                 "(`recovery::Report`). *store*: requests to the store answered and their bytes (a wait polled in "
                 "20 ms slices counts once; each rank's monitor also waits once for the epoch notice, not "
                 "included). *msgs*: peer signals waited for in barrier steps plus point-to-point messages of the "
                 "restore (its agreement and the state transfer). *agree B*: bytes of the restore's agreement "
                 "(who donates to whom) sent plus received. Survivors: every rank but rank 0 and the "
                 "replacement, the largest value (and the median). Rank 0 is the root of the agreement tree. "
                 "Controller: the launcher's own store requests for the failure (notice, timestamps, heartbeat "
                 "reset, spare hand-off). The one rank that arrives last in the rebuild makes one store request more (it raises the ready flag): 4 instead of 3.\n")
        L.append(md_row(["ranks", "survivor store ops", "survivor store B", "survivor msgs max (median)",
                         "survivor agree B max (median)", "rank 0 store ops", "rank 0 msgs", "rank 0 agree B",
                         "replacement store ops", "replacement store B", "controller store ops",
                         "controller store B"]))
        L.append(md_rule("r" * 12))
        for c in costs:
            sm, sd, r0, rp = c["surv_max"], c["surv_median"], c["r0"], c["repl"]
            L.append(f"| {c['n']} | {sm['store_ops']} | {sm['store_bytes']} | {sm['peer_waits']} "
                     f"({sd['peer_waits']:.0f}) | {sm['agree_bytes']} ({sd['agree_bytes']:.0f}) | "
                     f"{r0['store_ops']} | {r0['peer_waits']} | {r0['agree_bytes']} | {rp['store_ops']} | "
                     f"{rp['store_bytes']} | {c['ctl_ops']} | {c['ctl_bytes']} |")
        L.append("")
        L.append("Before the restore's agreement became a tree (the same count, measured with the previous code): "
                 "a survivor waited for 15 peer signals at 4 ranks and 75 at 16 (the rebuild ended with a barrier "
                 "over all N, and the plan was a gather to rank 0 and a broadcast of one entry per rank), and "
                 "sent plus received 88 and 184 agreement bytes; rank 0 296 and 2,792. Store traffic per survivor "
                 "was already 7 requests, 575 bytes at every N. Before the records were read in one request "
                 "(`get_many`), the notice taken from the monitor and the report's timestamps read when asked "
                 "for: a survivor made 7 requests (577 bytes), the replacement 12 / 24 / 72 / 264 at 4 / 16 / 64 "
                 "/ 256 ranks.\n")
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    plt = pyplot()
    if plt is not None:
        fig, ax = plt.subplots(figsize=(6.4, 4))
        ns = [r["n"] for r in rows]
        ax.plot(ns, [r["rto"] for r in rows], "o-", label="strata: replace failed rank, restore from replica")
        ax.plot(ns, [r["hot"]["rto"] for r in rows], "D-", label="strata with a hot spare (--spares 1)")
        if not a.no_baseline:
            ax.plot(ns, [r["base_rto"] for r in rows], "s-", label="baseline: restart all + checkpoint")
        ax.plot(ns, [r["detect_all"] for r in rows], "^--", label="strata detection (all survivors)")
        log_axes(ax, "ranks (one host, 2 cores)", "ms (median)", "Recovery time after a SIGKILL")
        ax.legend(fontsize=8)
        png = os.path.join(os.path.dirname(a.out), "recovery_rto.png")
        fig.tight_layout()
        fig.savefig(png, dpi=110)
        L.append("![RTO vs ranks](recovery_rto.png)\n")
    else:
        L.append("(matplotlib is not installed: `scripts/install_bench_deps.sh` adds it; no plot.)\n")
    L.append("## Reading the figures\n")
    L.append("The machine has 2 cores, so every extra rank is another process competing for them: start-up "
             "(exec, heap, mapping peers), the controller's own loop and the redone collective all slow down "
             "with N here for reasons that a host with a core per rank does not have. What recovery itself "
             "does per survivor does not grow with N: one epoch notice, dropping the failed rank's mappings, "
             "attaching its new control block, one store counter and one flag (see `src/recovery/rebuild.cpp`). "
             "The replacement maps the peers it talks to (every control block of the world communicator, "
             "its donor's state) and that is what grows. Mapping a peer installs only the pages its owner "
             "touched, found from the memfd's data extents (`SEEK_DATA`); probing every page of the 1 GiB "
             "segment with `mincore` cost ~10 ms per peer and was most of the join before. A hot spare maps "
             "its peers' control blocks while it waits, so the replacement it becomes maps none in the join "
             "(`Report::premapped`); and a peer's table of segments is made in chunks on first use (it was "
             "64 KiB per peer, 18-23 ms of first-touch faults for 63 peers).\n")
    L.append("A hot spare removes the process start-up and the program's own initialisation (imports in "
             "Python, loading the library) from the RTO: they are paid when the job starts, and again in the "
             "background after each recovery that used a spare (`strata run` starts the new spare 250 ms after the "
             "epoch's rebuild is complete, so that it does not compete with the recovery for the cores). For a C++ "
             "program that starts in a few milliseconds the gain is small; for a Python program importing "
             "numpy or torch it is hundreds of milliseconds to seconds (here `import numpy, strata` takes ~0.1 s, "
             "`import torch, strata` ~1 s).\n")
    L.append("What still grows with N on this machine is work every rank must do while 2 cores serve N "
             "processes: *detect* (the launcher is one process among N+1 that wake on the failure), *join* "
             "(every survivor attaches the new control block and bumps the arrival counter: constant work, "
             "but N processes take turns on 2 cores), *state* (the donor's transfer plus a tree agreement "
             "whose depth is log2 N) and *redo* (N ranks compute the step again). The counted table above "
             "shows what each survivor does: the same store traffic at every N, and messages that grow "
             "with log2 N on the ranks inside the agreement tree only. None of it is process start-up, and *start* stays flat with a "
             "spare; on a host with a core per rank these terms do not scale with N the same way. Run-to-run "
             "spread is large here: other helpers' builds and tests shared the 2 cores while these figures were taken (the load average above), so compare rows within one run of the script. The replacement reads every peer's world record in one store request (its requests do not grow with N, only their bytes) and maps every peer's control block, because the redone step's collectives need them all; survivors and the controller do not grow.\n")
    L += kept_section(a.out, "<!-- mh-begin -->", "<!-- mh-end -->")
    L += kept_torch_section(a.out)
    write_lines(a.out, L)
    print(f"wrote {a.out}", file=sys.stderr)


def kept_torch_section(path):
    """The PyTorch section scripts/bench_ddp_recovery.py wrote between its markers (markers
    included), kept as it is: this script measures train_dp only and must not drop it."""
    return kept_section(path, "<!-- ddp-begin -->", "<!-- ddp-end -->")


def kept_section(path, begin, end):
    """A section another script writes between its markers (scripts/bench_ddp_recovery.py,
    scripts/bench_recovery_multihost.py), markers included, kept as it is."""
    try:
        with open(path) as f:
            doc = f.read()
    except OSError:
        return []
    b = doc.find(begin)
    e = doc.find(end, b) if b >= 0 else -1
    return [doc[b:e + len(end)] + "\n"] if e >= 0 else []


if __name__ == "__main__":
    main()
