#pragma once
// What `strata bench` and its peers (bench/peers/mpi_bench.cpp, memcpy_probe.cpp) share, so
// that both measure the same sizes with the same method and write the same table, JSON and
// CSV. Free of libstrata symbols: the peers compile these files (STRATA_BENCH_SHARED_SOURCES
// in src/cli/sources.cmake) without linking the library. bench/peers/torch_bench.py mirrors
// them in Python; keep the two in step.
//
//   bench_colls.hpp   the collectives, types, data pattern and expected results
//   bench_args.hpp    the command line and its help
//   bench_sweep.hpp   the sizes of a sweep and the timing loop
//   bench_output.hpp  the table, JSON and CSV

#include "cli/bench_args.hpp"
#include "cli/bench_colls.hpp"
#include "cli/bench_output.hpp"
#include "cli/bench_sweep.hpp"
