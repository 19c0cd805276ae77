#pragma once
// The command line of `strata bench` and of its Open MPI peer (bench/peers/mpi_bench.cpp):
// one parser and one help text, so both take the same flags with the same meaning (those of
// nccl-tests where it has them: -b/-e/-f, -n, -w, -o, -d, -r). Sizes are parsed by
// common/parse.hpp: K/M/G are powers of 1024, as in nccl-tests.

#include <strata/types.hpp>

#include <cstddef>
#include <string>
#include <string_view>

#include "cli/bench_colls.hpp"
#include "cli/bench_neighbour.hpp"
#include "common/status.hpp"

namespace strata::bench {

/// Which program is parsing: `strata bench` or the MPI peer (which lacks the strata-only flags).
enum class Tool { Strata, Mpi };
/// Where strata bench's buffers come from.
enum class Buffers { Heap, External, Registered };
/// "heap", "external", "registered".
const char* buffers_name(Buffers b);
/// The all_reduce algorithm strata bench asks for.
enum class AlgoChoice { Auto, OneShot, TwoShot };
/// "auto", "one_shot", "two_shot".
const char* algo_name(AlgoChoice a);

/// Everything the command line sets.
struct Options {
  Coll coll = Coll::AllReduce;
  int nranks = 0;  // strata: -n; the peers take it from their launcher
  size_t min_bytes = 8;
  size_t max_bytes = size_t{64} << 20;
  double factor = 2;
  DataType dtype = DataType::Float32;
  ReduceOp op = ReduceOp::Sum;
  bool inplace = false;
  Buffers buffers = Buffers::Heap;
  AlgoChoice algorithm = AlgoChoice::Auto;
  int root = 0;
  int iters = 0;  // 0: as many as fit in target_ms (at least 1, at most max_iters)
  int warmup = 5;
  int repeats = 7;
  double target_ms = 20;
  int max_iters = 10000;
  bool check = true;
  bool quiet = false;
  Neighbour neighbour = Neighbour::None;  // started beside the ranks for the whole sweep
  std::string json, csv, plot, label;
  // strata bench internals: descriptors the launcher side hands its worker ranks.
  int worker_out_fd = -1, worker_err_fd = -1;
  bool worker = false;
};

/// The largest -b/-e: a sweep beyond 1 PiB is a typo.
inline constexpr size_t kMaxBenchBytes = size_t{1} << 50;

/// "8", "64K", "256M", "1G": common/parse.hpp's parse_size (binary; K/KiB/KB all mean 1024,
/// as in nccl-tests), at most kMaxBenchBytes.
Result<size_t> parse_bytes(std::string_view s);

/// "256 MiB", "8 KiB", "12 B": sizes as people read them.
std::string human_bytes(size_t b);

/// The --help text of `tool`.
std::string usage_text(Tool tool);

/// Why output file `path` of option `opt` could not be written, or "": checked before a sweep,
/// so that a typo does not cost the whole run. It opens the file for writing rather than asking
/// access(), which root passes on a read-only mount or in /proc; a file it creates it removes
/// again, an existing one it does not truncate.
std::string unwritable(const char* opt, const std::string& path);

/// Parses argv[first..argc). Returns an error message ("" when fine); sets `help` for -h.
/// -n is the rank count (strata bench); the MPI peer refuses it, mpirun -np sets the ranks.
std::string parse_options(int argc, char** argv, int first, Tool tool, Options& o, bool& help);

}  // namespace strata::bench
