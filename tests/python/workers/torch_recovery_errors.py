"""strata.recovery_run over a torch group, misused (run by test_torch_recovery.py).

    torch_recovery_errors.py mismatch   # rank 1 registers a tensor of another size
    torch_recovery_errors.py plain      # a correct script, launched without --ft

Prints `[r] RAISED <class> <message>` when recovery_run raised, `[r] OK` otherwise.
"""

import sys

import torch
import torch.distributed as dist

import strata

mode = sys.argv[1]
dist.init_process_group("strata")
rank = dist.get_rank()
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
