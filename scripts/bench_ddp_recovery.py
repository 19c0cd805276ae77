#!/usr/bin/env python3
"""Torch recovery figures for docs/RECOVERY.md ("PyTorch DDP"), from one run.

For N ranks on this host, side by side in the same run:
  - strata: `strata run --ft -n N python3 examples/python/ddp_recovery.py --fail 1:FAIL`
    (SIGKILL during the optimizer step); the controller replaces only that rank, the survivors
    keep their DDP model, recover() and restore the replacement from a replica;
  - torchrun: `torchrun --max_restarts 1` (torch 1.13 spelling of --max-restarts) running the same model (DDP, gloo) with a
    torch.save checkpoint every 5 steps; the kill restarts every rank, which reload the
    checkpoint and redo the steps since.
RTO = SIGKILL -> the interrupted step completed again. No hot spares: the replacement imports
torch and builds its model from scratch.

  scripts/bench_ddp_recovery.py [--ranks 2,4,8] [--repeats 2] [--build build] [--out docs/ddp_recovery.md]
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


def strata_once(build, n, steps, fail_step):
    env = dict(os.environ, PYTHONPATH=os.path.join(build, "python"))
    cmd = [os.path.join(build, "strata"), "run", "--ft", "-n", str(n), "--", PY, EXAMPLE, "--steps", str(steps),
           "--fail", f"1:{fail_step}:step", "--report"]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    if p.returncode != 0:
        raise RuntimeError(f"strata run failed (rc {p.returncode}):\n{p.stdout[-3000:]}{p.stderr[-3000:]}")
    recs = [kv(l) for l in p.stdout.splitlines() if "recovered epoch=" in l]
    redone = [kv(l)["ns"] for l in p.stdout.splitlines() if "redone step=" in l]
    inj = recs[0]["injected_ns"]
    ms = lambda a, b: (b - a) / 1e6
    detected, spawned = recs[0]["detected_ns"], recs[0]["spawned_ns"]
    rebuilt = max(r["rebuilt_ns"] for r in recs)
    restored = max(r["restored_ns"] for r in recs)
    done = max(redone)
    redone_steps = [kv(l)["step"] for l in p.stdout.splitlines() if "redone step=" in l]
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


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--torchrun-worker":
        torchrun_worker(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], 256)
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", default="2,4,8")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--steps", type=int, default=14)
    ap.add_argument("--fail-step", type=int, default=8)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    lines = [f"`scripts/bench_ddp_recovery.py --ranks {args.ranks} --repeats {args.repeats}` "
             f"(SIGKILL of rank 1 during the optimizer step of step {args.fail_step}; torchrun checkpoints every "
             f"{CKPT_EVERY} steps; medians of {args.repeats}; {os.cpu_count()} cores, load average "
             f"{load_line()} at the start; no hot spares).", ""]
    rows = []
    for n in [int(x) for x in args.ranks.split(",")]:
        s_runs, t_runs = [], []
        for _ in range(args.repeats):  # interleaved: both see the same load
            s_runs.append(strata_once(args.build, n, args.steps, args.fail_step))
            t_runs.append(torchrun_once(n, args.steps, args.fail_step))
        med = lambda runs, k: statistics.median(r[k] for r in runs)
        s = {k: med(s_runs, k) for k in s_runs[0]}
        t = {k: med(t_runs, k) for k in t_runs[0]}
        rows.append((n, s, t))
        print(f"n={n} strata {s}\n      torchrun {t}", flush=True)
    lines.append("| ranks | strata RTO ms | detect | spawn | replacement joins | setup+restore | redo | steps lost "
                 "| torchrun RTO ms | restart | init_process_group | model+reload | redone steps | steps lost "
                 "| torchrun / strata |")
    lines.append("|" + "---|" * 15)
    for n, s, t in rows:
        lines.append(f"| {n} | {s['rto']:.0f} | {s['detect']:.0f} | {s['spawn']:.0f} | {s['replacement joins']:.0f} | "
                     f"{s['setup+restore']:.0f} | {s['redo']:.0f} | {s['steps lost']:.0f} | {t['rto']:.0f} | "
                     f"{t['restart (detect+respawn+import)']:.0f} | {t['init_process_group']:.0f} | "
                     f"{t['model+reload']:.0f} | {t['redone steps']:.0f} | {t['steps lost']:.0f} | "
                     f"{t['rto'] / s['rto']:.1f}x |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
