"""Under torchrun (or a torchrun-style environment): strata.init() and
init_process_group("strata") in either order (argv[1]: "strata-first" or "torch-first") give
one communicator, and both APIs work."""

import sys

import torch
import torch.distributed as dist

import strata

order = sys.argv[1]
if order == "strata-first":
    comm = strata.init()
    dist.init_process_group("strata")
else:
    dist.init_process_group("strata")
    comm = strata.init()
assert strata.torch_communicator() is comm, "torch and strata.init() must share the world communicator"
r, n = comm.rank, comm.size
assert (r, n) == (dist.get_rank(), dist.get_world_size())
t = torch.full((1000,), float(r + 1))
dist.all_reduce(t)
assert (t == n * (n + 1) / 2).all(), t[:4]
a = comm.empty((1000,), "float32")
a[:] = 1
comm.all_reduce(a)
assert (a == n).all()
dist.barrier()
print(f"[{r}] OK", flush=True)
