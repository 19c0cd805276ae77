"""A torch job where rank 1 skips one all_reduce and stays alive: the others' strata.Timeout
names rank 1 and what it did last (the flight recorder, issue 20 item 1)."""

import re
import time

import torch
import torch.distributed as dist

import strata  # registers the backend

dist.init_process_group("strata")
r = dist.get_rank()
t = torch.ones(1024)
for _ in range(3):
    dist.all_reduce(t)
if r == 1:
    time.sleep(3)  # skips the fourth all_reduce, outside the library
    print(f"[{r}] OK", flush=True)
else:
    try:
        dist.all_reduce(t)
        raise AssertionError("all_reduce finished without rank 1")
    except strata.Timeout as e:
        msg = str(e)
        assert f"timed out on rank {r} waiting for rank 1 (operation #" in msg, msg
        m = re.search(r"rank 1's last operation: #(\d+) all_reduce float32 x1024 done .*nothing pending", msg)
        assert m, msg
        waited = int(re.search(r"\(operation #(\d+)", msg).group(1))
        assert waited == int(m.group(1)) + 1, msg
        print(f"[{r}] OK: {msg}", flush=True)
