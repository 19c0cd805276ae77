"""recovery_run: the step loop of C++ strata::recovery::run, for Python training code.

Why a commit barrier between compute and apply: a rank that finished its gradient
all_reduce cannot tell whether every other rank did too. Applying only after a barrier that
every rank passed makes a failure a clean discard of the step on all survivors; the one race
left (the barrier completed on some ranks and failed on others) is closed by State.restore(),
which brings whoever is behind up to the replica that applied the most steps.
"""

import re

from ._strata import (Aborted, Communicator, InvalidArgument, PeerFailed, Timeout, Unavailable, is_replacement,
                      last_recovery)
from ._strata import State as _CState

# The errors a failure of another rank produces; anything else is the caller's bug.
_RECOVERABLE = (PeerFailed, Aborted, Timeout)
# torch rethrows a process group's error as a plain RuntimeError when it passes through autograd
# or DDP's reducer; the strata backend marks the recoverable ones in the message.
_MARKER = re.compile(r"\[strata (PeerFailed|Aborted|Timeout)\]")


def _recoverable(e):
    return isinstance(e, _RECOVERABLE) or (isinstance(e, RuntimeError) and _MARKER.search(str(e)) is not None)


def _resolve(group):
    """(Communicator, process group or None) for a Communicator or a torch.distributed group
    (None: the default group)."""
    if group is not None and not _is_torch_group(group):
        return group, None  # a Communicator (or an object standing in for one)
    import sys
    dist = sys.modules.get("torch.distributed")
    if group is None and (dist is None or not dist.is_initialized()):
        raise InvalidArgument("got None for the group: pass a strata.Communicator, or call "
                              "torch.distributed.init_process_group('strata') first (None means its default group)")
    from . import _torch  # imports torch: only for torch groups
    pg = _torch.process_group(group)
    return _torch.communicator(pg), pg


def _is_torch_group(group):
    import sys
    dist = sys.modules.get("torch.distributed")
    return dist is not None and isinstance(group, dist.ProcessGroup)


def _check_ft(comm):
    if not isinstance(comm, Communicator):
        return
    from ._strata import under_ft
    if not under_ft():
        raise Unavailable("recovery_run needs a job started with `strata run --ft` (it replaces a failed rank); "
                          "this process was not started by it")


class State(_CState):
    """The training state a replacement rank needs, registered by name; see the C++ base for
    numpy arrays and tensors (add). ``State(group)`` also takes a torch.distributed group of
    backend "strata" (None: the default group), and torch objects: add_module, add_optimizer,
    add_rng. restore() writes into the very tensors registered."""

    def __init__(self, comm=None, replica_group=0):
        comm, _ = _resolve(comm)
        super().__init__(comm, replica_group)
        self._before = []  # called before restore(): objects -> registered tensors
        self._after = []   # called after restore(): registered tensors -> objects

    def add(self, name, array):
        import sys
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(array, torch.Tensor):
            if array.device.type != "cpu":
                raise InvalidArgument(f"State.add: '{name}' is on {array.device}; only CPU tensors can be registered")
            array = array.detach()
            if not array.is_contiguous():
                raise InvalidArgument(f"State.add: '{name}' is not contiguous; register a contiguous tensor")
        super().add(name, array)

    def add_module(self, name, module):
        """Registers every parameter and buffer of `module` (a DistributedDataParallel's
        inner module is taken), as ``name.param_name``."""
        module = getattr(module, "module", module) if type(module).__name__ == "DistributedDataParallel" else module
        for pname, p in module.named_parameters():
            self.add(f"{name}.{pname}", p)
        for bname, b in module.named_buffers():
            if b is not None:
                self.add(f"{name}.{bname}", b)

    def add_optimizer(self, name, optimizer):
        """Registers the optimizer's per-parameter state (materialised first when still empty:
        a zero-gradient step with learning rate 0, then every state tensor zeroed, which is what
        SGD (dampening 0) and Adam start from) and the numbers of its param_groups (lr, momentum...)."""
        import torch
        params = [p for g in optimizer.param_groups for p in g["params"]]
        if any(p not in optimizer.state or not optimizer.state[p] for p in params):
            _materialise(optimizer, params)
        numbers = []  # (container, key): numbers that live outside tensors
        for i, p in enumerate(params):
            for key in sorted(optimizer.state[p]):
                v = optimizer.state[p][key]
                if isinstance(v, torch.Tensor):
                    if not v.is_contiguous():
                        v = optimizer.state[p][key] = v.contiguous()
                    self.add(f"{name}.state.{i}.{key}", v)
                elif isinstance(v, (int, float)) and not isinstance(v, bool):
                    numbers.append((optimizer.state[p], key))
        for g in optimizer.param_groups:
            for key in sorted(g):
                if key != "params" and isinstance(g[key], (int, float)) and not isinstance(g[key], bool):
                    numbers.append((g, key))
        if numbers:
            box = torch.zeros(len(numbers), dtype=torch.float64)
            kinds = [type(c[k]) for c, k in numbers]

            def pack():
                for j, (c, k) in enumerate(numbers):
                    box[j] = float(c[k])

            def unpack():
                for j, (c, k) in enumerate(numbers):
                    c[k] = kinds[j](box[j].item())

            pack()
            self.add(f"{name}.numbers", box)
            self._before.append(pack)
            self._after.append(unpack)

    def add_rng(self, name):
        """Registers torch's CPU generator (torch.get_rng_state())."""
        import torch
        box = torch.get_rng_state().clone()

        def pack():
            box.copy_(torch.get_rng_state())

        def unpack():
            torch.set_rng_state(box)

        self.add(name, box)
        self._before.append(pack)
        self._after.append(unpack)

    def commit(self):
        """Copies what lives outside tensors (torch's RNG, the optimizer's numbers) into the
        registered buffers. recovery_run calls it before each step: restore() brings back the
        values of the step's start, so that a redone step draws the same random numbers."""
        for f in self._before:
            f()

    def restore(self):
        super().restore()
        for f in self._after:
            f()


def _materialise(optimizer, params):
    import torch
    saved_grads = [p.grad for p in params]
    saved_lr = [g.get("lr") for g in optimizer.param_groups]
    try:
        for p in params:
            p.grad = torch.zeros_like(p)
        for g in optimizer.param_groups:
            g["lr"] = 0.0
        optimizer.step()
    finally:
        for p, gr in zip(params, saved_grads):
            p.grad = gr
        for g, lr in zip(optimizer.param_groups, saved_lr):
            g["lr"] = lr
    with torch.no_grad():
        for p in params:
            for v in optimizer.state[p].values():
                if isinstance(v, torch.Tensor):
                    v.zero_()


def recovery_run(group, state, total_steps, compute, apply, *, max_recoveries=16, on_failure=None,
                 on_recovered=None, ddp_warmup=2):
    """Runs steps ``state.step`` .. ``total_steps - 1`` under the recovery protocol of
    ``strata run --ft``: ``compute(step)`` (local gradients and their all_reduce on ``group``),
    a commit barrier, then ``apply(step)`` (the optimizer update) and ``state.step += 1``.

    ``group`` is a strata Communicator or a torch.distributed process group of backend
    "strata" (None: the default group); the group is rebuilt in place, so a
    DistributedDataParallel model over it keeps working.

    When a step fails with PeerFailed, Aborted or Timeout (for a torch group also the
    RuntimeError torch makes of them), the step is discarded: ``on_failure()`` is called, the
    group's queued operations are discarded, ``comm.recover()`` rebuilds the world communicator
    (again if another failure interrupts it), ``state.restore()`` brings every rank to the same
    bytes and ``on_recovered(report)`` gets the RecoveryReport; then the step is redone. A
    replacement process calls this too: it starts with ``state.restore()``.

    For a torch group, every rank first runs ``compute`` ``ddp_warmup`` times with the group in
    local mode (collectives answered by the rank alone, results discarded): DDP rebuilds its
    buckets in its second iteration with a broadcast, and a replacement must have done so before
    it meets survivors that did it long ago. So the warm-up runs everywhere, identically.

    compute must leave no trace in the registered state (apply does the update), so that a
    step can be redone. The failure that makes the count exceed ``max_recoveries`` is re-raised;
    so is any other error.
    """
    if not callable(compute) or not callable(apply):
        raise InvalidArgument("recovery_run: compute and apply must be callables taking the step number")
    if max_recoveries < 0:
        raise InvalidArgument(f"recovery_run: max_recoveries must be >= 0, got {max_recoveries}")
    comm, pg = _resolve(group)
    _check_ft(comm)
    # A rank whose first setup a failure interrupted was rebuilt inside init(): it joins the
    # replacement's restore like any survivor (epoch > 0 before its first step).
    # For a torch group every rank starts with a restore: at the start it moves nothing, but it
    # compares what the ranks registered, so a mismatch is reported now, not at the first failure.
    need_restore = is_replacement() or comm.epoch > 0 or pg is not None
    check_only = need_restore and not (is_replacement() or comm.epoch > 0)  # no recovery to report
    if pg is not None:
        if state.step < total_steps and ddp_warmup > 0:
            pg._strata_local = True
            try:
                for _ in range(ddp_warmup):
                    compute(state.step)
            finally:
                pg._strata_local = False
        pg._strata_local = False
    recoveries = 0
    while True:
        try:
            if need_restore:
                state.restore()
                need_restore = False
                if check_only:
                    check_only = False
                elif on_recovered is not None:
                    on_recovered(last_recovery(comm))
            if state.step >= total_steps:
                return
            if hasattr(state, "commit"):
                state.commit()
            compute(state.step)
            comm.barrier()  # the commit point: every rank holds the step's reduced gradients
        except Exception as e:
            if not _recoverable(e):
                raise
            recoveries += 1
            if recoveries > max_recoveries:
                raise
            if on_failure is not None:
                on_failure()
            if pg is not None:
                pg._strata_discard_pending()
            while True:
                try:
                    comm.recover()
                    break
                except _RECOVERABLE:
                    # Another rank failed during the rebuild: the job moved to a newer epoch.
                    recoveries += 1
                    if recoveries > max_recoveries:
                        raise
            need_restore = True
            check_only = False
            continue
        apply(state.step)
        state.step += 1
