"""strata.recovery_run over a torch group, misused (run by test_torch_recovery.py).

    torch_recovery_errors.py mismatch   # rank 1 registers a tensor of another size
    torch_recovery_errors.py plain      # a correct script, launched without --ft
    torch_recovery_errors.py peerfailed # rank 1 dies; the others' dist.all_reduce raises, then
                                        # the same process group works after comm.recover()

Prints `[r] RAISED <class> <message>` when recovery_run raised, `[r] OK` otherwise.
"""

import sys

import torch
import torch.distributed as dist

import strata

mode = sys.argv[1]
dist.init_process_group("strata")
rank = dist.get_rank()
if mode == "peerfailed":
    import os
    import signal
    pg = dist.distributed_c10d._get_default_group()
    if strata.is_replacement():
        pg._strata_local = False  # what recovery_run does before its restore
    else:
        if rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            while True:
                dist.all_reduce(torch.ones(4))
        except Exception as e:  # noqa: BLE001
            print(f"RAISED {type(e).__name__} runtime_error={isinstance(e, RuntimeError)} "
                  f"peer_failed={isinstance(e, strata.PeerFailed)}", flush=True)
        pg._strata_discard_pending()
        strata.torch_communicator().recover()
    t = torch.ones(4)
    dist.all_reduce(t)  # the same ProcessGroup object, over the rebuilt communicator
    assert torch.equal(t, torch.full((4,), float(dist.get_world_size()))), t
    print("OK", flush=True)
    sys.exit(0)
state = strata.State(None)
size = 8 + (1 if mode == "mismatch" and rank == 1 else 0)
w = torch.zeros(size)
state.add("w", w)
try:
    strata.recovery_run(None, state, 3, lambda s: dist.all_reduce(torch.ones(2)), lambda s: w.add_(1.0))
except Exception as e:  # noqa: BLE001 - the test reads what was raised
    print(f"RAISED {type(e).__name__} {e}", flush=True)
    sys.exit(3)
print("OK", flush=True)
