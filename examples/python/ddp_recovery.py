"""DistributedDataParallel training that survives a lost rank, in place, with no checkpoint.

    strata run --ft -n 4 /usr/bin/python3 examples/python/ddp_recovery.py --steps 20
    strata run --ft -n 4 /usr/bin/python3 examples/python/ddp_recovery.py --steps 20 --fail 2:10

    strata run --ft --spares 1 -n 4 /usr/bin/python3 examples/python/ddp_recovery.py --steps 20 --fail 2:10

All three print the same `final params hash`: with --fail RANK:STEP[:MODE], rank RANK kills itself
(SIGKILL) at step STEP; `strata run --ft` starts a replacement that runs this same script, the
survivors keep their processes, their DDP model and their optimizer, and the replacement
receives the model, the optimizer's momentum and the RNG from a survivor. With --spares 1 the
replacement is a hot spare: a process started with the job that imported torch and waits in
init_process_group("strata") until the launcher gives it the failed rank. MODE says where in
the step: forward, backward (inside DDP's gradient all_reduce), step (during the optimizer
update; default) or recovery (the victim dies, then a survivor dies during the recovery).
"""

import argparse
import hashlib
import os
import signal
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import strata  # registers the "strata" backend


def die(rank, step, where):
    print(f"killing myself at step {step} ({where}) ns={strata.now_ns()}", flush=True)
    strata.mark_failure(strata.torch_communicator())
    os.kill(os.getpid(), signal.SIGKILL)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--accumulate", type=int, default=1, help="micro-batches per step (no_sync() for all but the last)")
    ap.add_argument("--fail", default="", help="RANK:STEP[:MODE], MODE forward|backward|step|recovery")
    ap.add_argument("--report", action="store_true", help="print the recovery report's timings")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.steps < 1 or args.hidden < 1 or args.accumulate < 1:
        ap.error("--steps, --hidden and --accumulate must be at least 1")
    fail_rank, fail_step, mode = -1, -1, "step"
    if args.fail:
        parts = args.fail.split(":")
        try:
            if len(parts) not in (2, 3):
                raise ValueError
            fail_rank, fail_step = int(parts[0]), int(parts[1])
        except ValueError:
            ap.error(f"--fail takes RANK:STEP[:MODE], not {args.fail!r}")
        mode = parts[2] if len(parts) > 2 else "step"
        if mode not in ("forward", "backward", "step", "recovery"):
            ap.error(f"--fail MODE must be forward, backward, step or recovery, not {mode!r}")
        # A fault that can never fire would leave the run looking recovered with nothing tested.
        world_size = int(os.environ.get("WORLD_SIZE", os.environ.get("STRATA_WORLD_SIZE", "0")) or 0)
        if not 0 <= fail_step < args.steps:
            ap.error(f"--fail names step {fail_step}, but the job runs steps 0..{args.steps - 1}")
        if fail_rank < 0 or (world_size and fail_rank >= world_size):
            ap.error(f"--fail names rank {fail_rank}, which the job of {world_size or '?'} ranks does not have")

    if "STRATA_SPARE" in os.environ:  # strata run --ft --spares K: imports paid before any failure
        print(f"spare ready, torch imported ns={strata.now_ns()}", flush=True)
    # In a replacement: joins the rebuilt group. In a hot spare: waits here for a failed rank,
    # then joins as that rank.
    dist.init_process_group("strata")
    rank, world = dist.get_rank(), dist.get_world_size()
    replacement = strata.is_replacement()
    torch.manual_seed(0)  # the same initial model everywhere (a replacement gets the trained one)
    model = torch.nn.Sequential(torch.nn.Linear(32, args.hidden), torch.nn.ReLU(),
                                torch.nn.Linear(args.hidden, args.hidden), torch.nn.ReLU(),
                                torch.nn.Linear(args.hidden, 10))
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.1)  # several buckets
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)

    state = strata.State()  # the default group's communicator
    state.add_module("model", ddp)
    state.add_optimizer("opt", opt)
    state.add_rng("rng")

    # Killing one's own process from inside DDP's all_reduce: a gradient hook on the first
    # layer's weight runs while buckets of later layers are already being reduced.
    def backward_hook(grad):
        if current["kill_in_backward"]:
            die(rank, current["step"], "backward, inside DDP's all_reduce")
        return grad

    current = {"step": -1, "kill_in_backward": False}
    model[0].weight.register_hook(backward_hook)
    victim = not replacement and rank == fail_rank

    def batch(step, micro):
        # Data from (step, rank, micro): a redone step sees the same batch.
        g = torch.Generator().manual_seed(1_000_003 * step + 1009 * rank + micro)
        return torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)

    def compute(step):
        current["step"] = step
        opt.zero_grad(set_to_none=False)
        for micro in range(args.accumulate):
            x, y = batch(step, micro)
            x = x + 0.01 * torch.randn_like(x)  # uses torch's RNG: part of the state
            last = micro == args.accumulate - 1
            with (ddp.no_sync() if not last else _null()):
                if victim and step == fail_step and mode == "forward" and last:
                    die(rank, step, "forward")
                out = ddp(x)
                loss = F.cross_entropy(out, y) / args.accumulate
                current["kill_in_backward"] = victim and step == fail_step and mode == "backward" and last
                loss.backward()
                current["kill_in_backward"] = False

    def apply(step):
        if args.report and recovered["pending"]:
            recovered["pending"] = False  # the interrupted step, done again: the end of the RTO
            print(f"redone step={step} ns={strata.now_ns()}", flush=True)
        if victim and step == fail_step and mode in ("step", "recovery"):
            with torch.no_grad():
                model[0].weight.add_(1.0)  # a half-done update dies with the process
            die(rank, step, "optimizer step")
        opt.step()

    def on_failure():
        if mode != "recovery" or replacement or state_flag["done"] or world < 3:
            return
        # The second victim: the next rank after the first, but not rank 0 (see docs/RECOVERY.md:
        # rank 0 dying while a replacement is still inside init() is not recovered yet).
        second = next((fail_rank + k) % world for k in range(1, world) if (fail_rank + k) % world != 0)
        if rank == second:
            state_flag["done"] = True
            die(rank, current["step"], "recovery")

    state_flag = {"done": False}
    recovered = {"pending": False}

    def on_recovered(report):
        recovered["pending"] = True
        if args.report:
            print(f"recovered epoch={report.epoch} failed={list(report.failed)} "
                  f"detected_ns={report.detected_ns} injected_ns={report.injected_ns} "
                  f"spawned_ns={report.spawned_ns} rebuilt_ns={report.rebuilt_ns} "
                  f"restored_ns={report.restored_ns} restored_bytes={report.restored_bytes} "
                  f"step={state.step} replacement={report.replacement}", flush=True)

    t0 = time.perf_counter()
    strata.recovery_run(None, state, args.steps, compute, apply, on_failure=on_failure, on_recovered=on_recovered)
    elapsed = time.perf_counter() - t0
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    for p in model.parameters():
        h.update(opt.state[p]["momentum_buffer"].numpy().tobytes())
    digest = h.hexdigest()[:16]
    dist.all_reduce(torch.zeros(1))  # every rank reaches the end
    if rank == 0:
        print(f"final params hash {digest}", flush=True)
    print(f"OK steps={args.steps} hash={digest} elapsed={elapsed:.3f}s replacement={replacement}", flush=True)
    dist.destroy_process_group()


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    main()
