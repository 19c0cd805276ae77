"""`import strata` first, torch after it: the backend is registered all the same."""

import sys

import strata

assert "torch" not in sys.modules, "importing strata must not import torch"
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

dist.init_process_group("strata")
t = torch.full((4,), float(dist.get_rank()))
dist.all_reduce(t)
n = dist.get_world_size()
assert (t == n * (n - 1) / 2).all(), t
assert strata.torch_communicator() is strata.world()
print("OK", flush=True)
