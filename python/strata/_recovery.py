"""recovery_run: the step loop of C++ strata::recovery::run, for Python training code.

Why a commit barrier between compute and apply: a rank that finished its gradient
all_reduce cannot tell whether every other rank did too. Applying only after a barrier that
every rank passed makes a failure a clean discard of the step on all survivors; the one race
left (the barrier completed on some ranks and failed on others) is closed by State.restore(),
which brings whoever is behind up to the replica that applied the most steps.
"""

from ._strata import Aborted, InvalidArgument, PeerFailed, Timeout, is_replacement, last_recovery

# The errors a failure of another rank produces; anything else is the caller's bug.
_RECOVERABLE = (PeerFailed, Aborted, Timeout)


def recovery_run(comm, state, total_steps, compute, apply, *, max_recoveries=16, on_failure=None,
                 on_recovered=None):
    """Runs steps ``state.step`` .. ``total_steps - 1`` under the recovery protocol of
    ``strata run --ft``: ``compute(step)`` (local gradients and their all_reduce on ``comm``),
    a commit barrier, then ``apply(step)`` (the optimizer update) and ``state.step += 1``.

    When a step fails with PeerFailed, Aborted or Timeout, the step is discarded:
    ``on_failure()`` is called, ``comm.recover()`` rebuilds the world communicator (again if
    another failure interrupts it), ``state.restore()`` brings every rank to the same bytes and
    ``on_recovered(report)`` gets the RecoveryReport; then the step is redone. A replacement
    process calls this too: it starts with ``state.restore()``.

    compute must leave no trace in the registered state (apply does the update), so that a
    step can be redone. The failure that makes the count exceed ``max_recoveries`` is re-raised;
    so is any other error.
    """
    if not callable(compute) or not callable(apply):
        raise InvalidArgument("recovery_run: compute and apply must be callables taking the step number")
    if max_recoveries < 0:
        raise InvalidArgument(f"recovery_run: max_recoveries must be >= 0, got {max_recoveries}")
    # A rank whose first setup a failure interrupted was rebuilt inside init(): it joins the
    # replacement's restore like any survivor (epoch > 0 before its first step).
    need_restore = is_replacement() or comm.epoch > 0
    recoveries = 0
    while True:
        try:
            if need_restore:
                state.restore()
                need_restore = False
                if on_recovered is not None:
                    on_recovered(last_recovery(comm))
            if state.step >= total_steps:
                return
            compute(state.step)
            comm.barrier()  # the commit point: every rank holds the step's reduced gradients
        except _RECOVERABLE:
            recoveries += 1
            if recoveries > max_recoveries:
                raise
            if on_failure is not None:
                on_failure()
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
            continue
        apply(state.step)
        state.step += 1
