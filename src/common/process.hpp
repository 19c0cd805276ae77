#pragma once
// Facts about this process that every layer's waits and checks need: whether it is a child
// forked after the library made its state, and whether a signal asked the program to stop.

#include <cstdint>

namespace strata {

/// How many forks lie between the process that loaded the library and this one (a
/// pthread_atfork child handler counts them). A forked child has copies of the parent's
/// communicators but not its threads (copy engine, monitor), and the peers know only the
/// parent: it must neither act as the parent's rank nor tear down what the parent still uses.
/// Compared in an operation's fast path, where getpid(), a system call, would cost more.
uint64_t fork_generation();

/// A function that says whether the program was interrupted (a language binding runs its
/// signal handlers there: Python's KeyboardInterrupt). Waits that sleep call it about every
/// millisecond; true aborts the communicator being waited on.
using InterruptCheck = bool (*)();
/// Installs `check` for every wait of this process (nullptr: none, the default).
void set_interrupt_check(InterruptCheck check);
/// The installed check's answer; false when none is installed.
bool interrupt_requested();

}  // namespace strata
