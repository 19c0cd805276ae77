#!/usr/bin/env python3
"""Torch recovery figures: the "PyTorch" section of docs/RECOVERY.md, from one run.

For N ranks on this host, side by side in the same run (interleaved per repeat):
  - strata: `strata run --ft -n N python3 examples/python/ddp_recovery.py --fail 1:FAIL`
    (SIGKILL during the optimizer step); the controller replaces only that rank, the survivors
    keep their DDP model, recover() and restore the replacement from a replica; the
    replacement is a fresh python3 that imports torch;
  - strata + hot spare: the same with `--spares 1`: the rank goes to a process that already
    imported torch and waits in init_process_group("strata");
  - torchrun: `torchrun --max_restarts 1` (torch 1.13 spelling of --max-restarts) running the
    same model (DDP, gloo) with a torch.save checkpoint every 5 steps; the kill restarts every
    rank, which reload the checkpoint and redo the steps since.
RTO = SIGKILL -> the interrupted step completed again.

The section it writes lies between the markers <!-- ddp-begin --> and <!-- ddp-end --> of
--out (default docs/RECOVERY.md); the rest of the file is kept, and scripts/bench_recovery.py
keeps this section when it rewrites the rest. --out - prints it only.

  scripts/bench_ddp_recovery.py [--ranks 2,4,8,32] [--repeats 2] [--build build] [--out docs/RECOVERY.md]
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "python", "ddp_recovery.py")
PY = "/usr/bin/python3"
CKPT_EVERY = 5


def kv(line):
    return {k: int(v) for k, v in re.findall(r"(\w+)=(-?\d+)", line)}


BEGIN, END = "<!-- ddp-begin -->", "<!-- ddp-end -->"


def strata_once(build, n, steps, fail_step, spares=0):
    env = dict(os.environ, PYTHONPATH=os.path.join(build, "python"))
    cmd = [os.path.join(build, "strata"), "run", "--ft", "--spares", str(spares), "-n", str(n), "--", PY, EXAMPLE,
           "--steps", str(steps), "--fail", f"1:{fail_step}:step", "--report"]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    if p.returncode != 0:
        raise RuntimeError(f"strata run failed (rc {p.returncode}):\n{p.stdout[-3000:]}{p.stderr[-3000:]}")
    recs = [kv(l) for l in p.stdout.splitlines() if "recovered epoch=" in l]
    redone = [kv(l)["ns"] for l in p.stdout.splitlines() if "redone step=" in l]
    inj = recs[0]["injected_ns"]
    ms = lambda a, b: (b - a) / 1e6
    # Every rank reads the same keys; take the latest any of them saw (0 = not yet written).
    detected, spawned = recs[0]["detected_ns"], max(r["spawned_ns"] for r in recs)
    rebuilt = max(r["rebuilt_ns"] for r in recs)
    restored = max(r["restored_ns"] for r in recs)
    done = max(redone)
    redone_steps = [kv(l)["step"] for l in p.stdout.splitlines() if "redone step=" in l]
    if spares and not re.search(r"rank 1 goes to spare \d+", p.stdout + p.stderr):
        raise RuntimeError("with --spares the replacement was not the spare:\n" + p.stdout[-3000:])
    return {"rto": ms(inj, done), "detect": ms(inj, detected), "spawn": ms(detected, spawned),
            "replacement joins": ms(spawned, rebuilt), "setup+restore": ms(rebuilt, restored),
            "redo": ms(restored, done), "steps lost": max(0, fail_step + 1 - min(redone_steps))}


# ---- torchrun baseline: this file is also its worker ----------------------------------------

def torchrun_worker(steps, fail_step, ckpt, hidden):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    t_start = time.time_ns()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    t_init = time.time_ns()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
                                torch.nn.ReLU(), torch.nn.Linear(hidden, 10))
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.1)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    start = 0
    if os.path.exists(ckpt):
        saved = torch.load(ckpt)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        torch.set_rng_state(saved["rng"])
        start = saved["step"]
    t_loaded = time.time_ns()
    if restart:
        print(f"RESTART rank={rank} start_ns={t_start} init_ns={t_init} loaded_ns={t_loaded} from_step={start}",
              flush=True)
    for step in range(start, steps):
        if step % CKPT_EVERY == 0 and rank == 0:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "rng": torch.get_rng_state(),
                        "step": step}, ckpt + ".tmp")
            os.replace(ckpt + ".tmp", ckpt)
        dist.barrier()
        g = torch.Generator().manual_seed(1_000_003 * step + 1009 * rank)
        x, y = torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)
        x = x + 0.01 * torch.randn_like(x)
        opt.zero_grad(set_to_none=False)
        F.cross_entropy(ddp(x), y).backward()
        if rank == 1 and step == fail_step and not restart:
            print(f"KILL ns={time.time_ns()}", flush=True)
            os.kill(os.getpid(), 9)
        opt.step()
        if restart and step == fail_step and rank == 0:
            print(f"REDONE ns={time.time_ns()}", flush=True)
    dist.destroy_process_group()


def torchrun_once(n, steps, fail_step):
    with tempfile.TemporaryDirectory() as d:
        ckpt = os.path.join(d, "ckpt.pt")
        # --redirects/--tee 1: Debian's torch 1.13 torchrun cannot parse its default under Python 3.11.
        cmd = [PY, "-m", "torch.distributed.run", "--standalone", "--redirects", "1", "--tee", "1",
               "--nproc_per_node", str(n), "--max_restarts", "1", "--monitor_interval",
               "0.1", os.path.abspath(__file__), "--torchrun-worker", str(steps), str(fail_step), ckpt]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise RuntimeError(f"torchrun failed (rc {p.returncode}):\n{p.stdout[-3000:]}{p.stderr[-3000:]}")
    out = [re.sub(r"^\[\S+\]:", "", l) for l in p.stdout.splitlines()]  # --tee prefixes "[default0]:"
    kill = kv(next(l for l in out if l.startswith("KILL")))["ns"]
    redone = kv(next(l for l in out if l.startswith("REDONE")))["ns"]
    r = [kv(l) for l in out if l.startswith("RESTART")]
    ms = lambda a, b: (b - a) / 1e6
    start = min(x["start_ns"] for x in r)
    init = max(x["init_ns"] for x in r)
    loaded = max(x["loaded_ns"] for x in r)
    from_step = r[0]["from_step"]
    return {"rto": ms(kill, redone), "restart (detect+respawn+import)": ms(kill, start), "init_process_group": ms(start, init),
            "model+reload": ms(init, loaded), "redone steps": ms(loaded, redone), "steps lost": fail_step - from_step}


def load_line():
    with open("/proc/loadavg") as f:
        return f.read().split()[0]


def section(args, rows, load):
    """The markdown of the section (markers excluded)."""
    ms = lambda x: f"{x:.0f}"
    L = ["## PyTorch: DistributedDataParallel, against torchrun", "",
         "Generated by `scripts/bench_ddp_recovery.py` (one run; strata, strata with a hot spare and torchrun "
         "interleaved per repeat so they see the same load); reproduce with:", "",
         "```sh", f"make bench-recovery-torch   # = /usr/bin/python3 scripts/bench_ddp_recovery.py --ranks {args.ranks} "
         f"--repeats {args.repeats}", "```", "",
         "N ranks of `examples/python/ddp_recovery.py` (an MLP 32-256-256-10 wrapped in DDP with several buckets, "
         "SGD with momentum; 605 KiB of state: parameters, momentum, optimizer numbers, RNG), "
         f"{args.steps} steps, rank 1 SIGKILLed during the optimizer step of step {args.fail_step}. "
         "**strata**: `strata run --ft` replaces rank 1 alone with a fresh `python3` that imports torch; the "
         "survivors keep their processes, DDP model and optimizer (`strata.recovery_run` over the default torch "
         "group). **strata + hot spare**: `strata run --ft --spares 1`: the replacement is a process started with "
         "the job that already imported torch and waits in `dist.init_process_group(\"strata\")`. **torchrun**: "
         "`torchrun --max_restarts 1` (torch 1.13's spelling of `--max-restarts`), the same model over gloo, "
         f"`torch.save` checkpoint by rank 0 every {CKPT_EVERY} steps; the kill restarts every rank, which reload it "
         "and redo the lost steps. RTO = kill → the interrupted step completed again. Times in ms, medians of "
         f"{args.repeats} (per column, so a breakdown need not add up to its RTO). {os.cpu_count()} cores shared with other work (load average {load} when the script "
         "started): only the ratios measured side by side are meaningful.", "",
         "| ranks | strata RTO | strata + hot spare RTO | torchrun RTO | torchrun / strata | "
         "torchrun / strata + hot spare | steps lost (strata, spare, torchrun) |",
         "|---:|---:|---:|---:|---:|---:|---|"]
    for n, s, h, t in rows:
        L.append(f"| {n} | {ms(s['rto'])} | {ms(h['rto'])} | {ms(t['rto'])} | {t['rto'] / s['rto']:.1f}× | "
                 f"{t['rto'] / h['rto']:.1f}× | {s['steps lost']:.0f}, {h['steps lost']:.0f}, {t['steps lost']:.0f} |")
    L += ["", "strata's breakdown, without / with a hot spare:", "",
          "| ranks | spare | RTO | detect | spawn | replacement joins | setup + restore | redo |",
          "|---:|---|---:|---:|---:|---:|---:|---:|"]
    for n, s, h, _ in rows:
        for name, r in (("no", s), ("1", h)):
            L.append(f"| {n} | {name} | {ms(r['rto'])} | {ms(r['detect'])} | {ms(r['spawn'])} | "
                     f"{ms(r['replacement joins'])} | {ms(r['setup+restore'])} | {ms(r['redo'])} |")
    L += ["", "torchrun's breakdown:", "",
          "| ranks | RTO | restart (detect, respawn, import) | init_process_group | model + reload | redone steps |",
          "|---:|---:|---:|---:|---:|---:|"]
    for n, _, _, t in rows:
        L.append(f"| {n} | {ms(t['rto'])} | {ms(t['restart (detect+respawn+import)'])} | "
                 f"{ms(t['init_process_group'])} | {ms(t['model+reload'])} | {ms(t['redone steps'])} |")
    L += ["",
          "- strata breakdown: *detect* kill → controller noticed; *spawn* → replacement started (with a hot spare: "
          "→ the rank handed to the spare); *replacement joins* → every rank rebuilt the world communicator (a "
          "fresh replacement's Python start, `import torch` and `strata.init()`; a spare's wake-up and join); "
          "*setup + restore* → every rank restored (the replacement's `init_process_group`, model, DDP in local "
          "mode, and the state copy); *redo* → the interrupted step done again.",
          "- 0 steps lost for strata in every run (the interrupted step was not committed; the final `params hash` "
          "equals the run without failure — `tests/python/test_torch_recovery.py` checks it for kills in forward, "
          "inside DDP's all_reduce, in the optimizer step, during recovery, with `no_sync()` accumulation and with "
          f"a hot spare); torchrun redoes the steps since its checkpoint.", ""]
    n, s, h, t = rows[-1]
    own = s["detect"] + s["spawn"] + s["setup+restore"] + s["redo"]
    L.append(f"Against the targets of issue 16 at {n} ranks: RTO with a hot spare {ms(h['rto'])} ms "
             f"({'meets' if h['rto'] <= 1000 else 'misses'} ≤ 1 s), {t['rto'] / h['rto']:.1f}× faster than torchrun "
             f"({'meets' if t['rto'] / h['rto'] >= 10 else 'misses'} ≥ 10×), {h['steps lost']:.0f} steps lost. Without a spare "
             f"{ms(s['rto'])} ms ({t['rto'] / s['rto']:.1f}×), of which the replacement's start (Python, "
             f"`import torch`, `strata.init()`) is {ms(s['replacement joins'])} ms and strata's own recovery "
             f"(detect + spawn + setup/restore + redo) {ms(own)} ms. torchrun's cost grows with N here because "
             "every rank re-imports torch on 2 cores; on a host with a core per rank its restart would be closer to "
             "one import (~0.8 s) plus its rendezvous.")
    at32 = [r for r in rows if r[0] == 32]
    if at32:
        _, _, h32, t32 = at32[0]
        ratio = t32["rto"] / h32["rto"]
        L.append("")
        L.append(f"Against issue 15's restart-all target at 32 ranks: torchrun's restart of every rank takes "
                 f"{ratio:.1f}× strata's recovery with a hot spare ({'meets' if ratio >= 20 else 'misses'} ≥ 20×). "
                 "The C++ `train_dp` baseline of `make bench-recovery` is lower because a C++ process starts in "
                 "milliseconds; a training job that imports torch is the case that target describes.")
    return "\n".join(L) + "\n"


def replace_section(path, text):
    """Puts `text` between the markers in `path` (appended with them if absent)."""
    doc = open(path).read() if os.path.exists(path) else ""
    block = f"{BEGIN}\n{text}{END}\n"
    b = doc.find(BEGIN)
    e = doc.find(END, b) if b >= 0 else -1
    if b >= 0 and e >= 0:
        rest = doc[e + len(END):].lstrip("\n")
        doc = doc[:b] + block + ("\n" + rest if rest else "")
    else:
        doc = doc.rstrip("\n") + ("\n\n" if doc else "") + block
    with open(path, "w") as f:
        f.write(doc)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--torchrun-worker":
        torchrun_worker(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], 256)
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", default="2,4,8,32")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--steps", type=int, default=14)
    ap.add_argument("--fail-step", type=int, default=8)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "RECOVERY.md"), help="- to print only")
    args = ap.parse_args()
    load = load_line()
    rows = []
    for n in [int(x) for x in args.ranks.split(",")]:
        s_runs, h_runs, t_runs = [], [], []
        for i in range(args.repeats):  # interleaved: all three see the same load
            s_runs.append(strata_once(args.build, n, args.steps, args.fail_step))
            h_runs.append(strata_once(args.build, n, args.steps, args.fail_step, spares=1))
            for attempt in range(3):  # torchrun's own rendezvous store fails now and then under load
                try:
                    t_runs.append(torchrun_once(n, args.steps, args.fail_step))
                    break
                except RuntimeError as e:
                    if attempt == 2:
                        raise
                    print(f"n={n}: torchrun failed, run again ({str(e).splitlines()[-1][:200]})", file=sys.stderr)
            print(f"n={n} run {i + 1}/{args.repeats}: strata {s_runs[-1]['rto']:.0f} ms, hot spare "
                  f"{h_runs[-1]['rto']:.0f} ms, torchrun {t_runs[-1]['rto']:.0f} ms", file=sys.stderr, flush=True)
        med = lambda runs: {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        rows.append((n, med(s_runs), med(h_runs), med(t_runs)))
    text = section(args, rows, load)
    print(text)
    if args.out != "-":
        replace_section(args.out, text)
        print(f"wrote the PyTorch section of {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
