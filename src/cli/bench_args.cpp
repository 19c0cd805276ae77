#include "cli/bench_args.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "common/parse.hpp"

namespace strata::bench {

const char* buffers_name(Buffers b) {
  return b == Buffers::Heap ? "heap" : b == Buffers::External ? "external" : "registered";
}

const char* algo_name(AlgoChoice a) {
  return a == AlgoChoice::Auto ? "auto" : a == AlgoChoice::OneShot ? "one_shot" : "two_shot";
}

Result<size_t> parse_bytes(std::string_view s) {
  Result<size_t> v = parse_size(s);
  if (!v.is_ok()) return v;
  if (*v > kMaxBenchBytes) return invalid_argument("'" + std::string(s) + "' is larger than the bench sweeps (1 PiB)");
  return v;
}

std::string human_bytes(size_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB"};
  int u = 0;
  while (u < 3 && b >= 1024 && b % 1024 == 0) b /= 1024, ++u;
  return std::to_string(b) + " " + units[u];
}

std::string usage_text(Tool tool) {
  std::string prog = tool == Tool::Strata ? "strata bench" : "mpirun -np N mpi_bench";
  std::string u =
      "usage: " + prog + " COLLECTIVE" + (tool == Tool::Strata ? " -n N" : "") +
      " [-b MIN] [-e MAX] [-f FACTOR] [options]\n"
      "\n"
      "COLLECTIVE: all_reduce reduce broadcast all_gather reduce_scatter all_to_all gather\n"
      "            scatter barrier sendrecv\n" +
      std::string(tool == Tool::Strata ? "            (MoE dispatch/combine: strata bench moe --help)\n" : "") +
      "\n"
      "Sizes (as nccl-tests): -b/-e are message sizes in bytes; sizes: 8, 4K, 16M, 1G - K/M/G\n"
      "  (also KiB/MiB/GiB and KB/MB/GB) are powers of 1024.\n"
      "  all_reduce, reduce, broadcast, sendrecv: the buffer each rank passes.\n"
      "  all_gather, reduce_scatter, all_to_all, gather, scatter: the total buffer, i.e.\n"
      "  N ranks x the per-rank block (the all_gather output, the reduce_scatter input).\n"
      "\n"
      "options:\n";
  if (tool == Tool::Strata) {
    u += "  -n, --np N          ranks to start (through the launcher of 'strata run')\n";
    u += "  --as-rank           be one rank of a job someone else started (strata run --nnodes\n"
         "                      on every host, mpirun, ...) instead of starting -n ranks; rank 0\n"
         "                      prints the table\n";
  }
  u += "  -b, --minbytes S    smallest size, e.g. 8, 4K, 16M (default 8; K/M/G = powers of 1024)\n"
       "  -e, --maxbytes S    largest size, e.g. 1M, 1G (default 64M; K/M/G = powers of 1024)\n"
       "  -f, --stepfactor F  multiply the size by F per step (default 2)\n"
       "                      each size is rounded down to whole elements (to whole blocks of\n"
       "                      N elements for all_gather, reduce_scatter, all_to_all, gather,\n"
       "                      scatter), and is at least one of them: the size column says\n"
       "                      what ran\n"
       "  -d, --dtype T       int8 uint8 int32 uint32 int64 uint64 float16 bfloat16 float32 float64\n"
       "                      (default float32)\n"
       "  -o, --op OP         sum prod min max avg (default sum)\n"
       "  -r, --root R        root of reduce, broadcast, gather, scatter (default 0)\n"
       "  --inplace           in-place layout (MPI's; see docs/SEMANTICS.md)\n";
  if (tool == Tool::Strata)
    u += "  --buffers B         heap (registered on allocation), external (malloc'd, staged) or\n"
         "                      registered (malloc'd + register_buffer: single-copy CMA from\n"
         "                      STRATA_CMA_REGISTERED_MIN_BYTES, staged below); default heap\n"
         "  --algorithm A       auto, one_shot, two_shot (all_reduce; default auto)\n";
  u += "  --iters K           timed calls per repeat (default: as many as fit in --target-ms,\n"
       "                      1..--max-iters)\n"
       "  -w, --warmup W      untimed calls per size before timing (default 5)\n"
       "  --repeats R         timed repeats per size; the median is reported (default 7)\n"
       "  --target-ms T       length of one repeat in milliseconds when --iters is not given\n"
       "                      (a plain number, default 20)\n"
       "  --max-iters K       cap on the automatic iteration count (default 10000)\n"
       "  --no-check          skip the correctness check\n"
       "  --json FILE         write the results as one JSON document\n"
       "  --csv FILE          write the results as CSV\n";
  if (tool == Tool::Strata) u += "  --plot FILE.png     plot busbw and time vs size (needs python3 with matplotlib)\n";
  u += "  --label NAME        system name in the JSON/CSV (default " +
       std::string(tool == Tool::Strata ? "strata-<buffers>" : "openmpi") +
       ")\n"
       "  --neighbour K       run a neighbour process beside the ranks for the whole sweep, one\n"
       "                      thread per usable core: sleepy (each thread spins " +
       std::to_string(kSleepyBusyUs) +
       " us, then\n"
       "                      sleeps " +
       std::to_string(kSleepyMinSleepUs) + "-" + std::to_string(kSleepyMaxSleepUs) +
       " us, drawn at random), busy (spins), none\n"
       "                      (default); " +
       std::string(tool == Tool::Strata ? "started by the launcher" : "started by rank 0") +
       ", killed at the end\n"
       "  -q, --quiet         no progress on stderr\n"
       "  -h, --help          this help\n"
       "\n"
       "Time per size: after the warm-up, R repeats each time a loop of K back-to-back calls and\n"
       "divide by K (as nccl-tests); a repeat's time is the slowest rank's; the median of the R\n"
       "repeats is reported. algbw = size / time; busbw = algbw x 2(n-1)/n for all_reduce,\n"
       "(n-1)/n for all_gather, reduce_scatter, all_to_all, gather, scatter, 1 otherwise.\n"
       "The result of every size is checked once (ok/FAIL); any FAIL makes the exit status 1.\n";
  if (tool == Tool::Strata) u += "\nExample: strata bench all_reduce -n 2 -b 8 -e 256M -f 2 --json ar.json\n";
  return u;
}

std::string unwritable(const char* opt, const std::string& path) {
  if (path.empty()) return "";
  struct stat st {};
  const bool exists = ::stat(path.c_str(), &st) == 0;
  if (exists && S_ISDIR(st.st_mode)) return std::string(opt) + " " + path + ": is a directory, not a file to write";
  const bool created = !exists;
  // O_NONBLOCK: a FIFO nobody reads must not block the probe.
  const int fd = ::open(path.c_str(), (exists ? O_WRONLY : O_WRONLY | O_CREAT | O_EXCL) | O_CLOEXEC | O_NONBLOCK, 0644);
  // EEXIST for a name that did not exist: another rank is probing it at this moment (every
  // rank parses the options), or a dangling symlink that the write will follow; either way
  // the directory takes new files.
  if (fd < 0 && created && errno == EEXIST) return "";
  if (fd < 0 && exists && errno == ENXIO) return "";  // a FIFO without a reader yet
  // Gone between the stat and the open: another rank's probe created and removed it (one rank
  // refusing the options alone would leave the others waiting in their first collective).
  if (fd < 0 && exists && errno == ENOENT) return "";
  if (fd < 0) {
    const std::string why = std::strerror(errno);
    if (!created) return std::string(opt) + " " + path + ": cannot write it (" + why + ")";
    const size_t slash = path.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
    return std::string(opt) + " " + path + ": cannot write in " + dir + " (" + why + ")";
  }
  ::close(fd);
  if (created) ::unlink(path.c_str());
  return "";
}

std::string parse_options(int argc, char** argv, int first, Tool tool, Options& o, bool& help) {
  help = false;
  bool have_coll = false, root_given = false;
  auto take = [&](int& i, std::initializer_list<std::string_view> names, std::string& value,
                  std::string& error) -> bool {
    std::string_view arg = argv[i];
    for (std::string_view name : names) {
      if (arg == name) {
        if (i + 1 >= argc) {
          error = "option " + std::string(name) + " needs a value";
          return true;
        }
        value = argv[i + 1];
        i += 2;
        return true;
      }
      if (name.starts_with("--") && arg.size() > name.size() && arg.starts_with(name) && arg[name.size()] == '=') {
        value = std::string(arg.substr(name.size() + 1));
        ++i;
        return true;
      }
      if (name.size() == 2 && name[1] != '-' && arg.size() > 2 && arg.starts_with(name) && arg[1] != '-') {
        value = std::string(arg.substr(2));
        ++i;
        return true;
      }
    }
    return false;
  };
  auto to_int = [](const std::string& s, long lo, long hi) -> std::optional<int> {
    auto v = parse_int(s, lo, hi);
    if (!v.is_ok()) return std::nullopt;
    return static_cast<int>(*v);
  };
  const bool strata = tool == Tool::Strata;
  int i = first;
  while (i < argc) {
    std::string_view arg = argv[i];
    std::string v, err;
    if (arg == "-h" || arg == "--help") {
      help = true;
      return "";
    }
    if (arg == "--inplace") {
      o.inplace = true;
      ++i;
    } else if (arg == "--no-check") {
      o.check = false;
      ++i;
    } else if (arg == "-q" || arg == "--quiet") {
      o.quiet = true;
      ++i;
    } else if (take(i, {"--np", "-np", "--nranks", "-n"}, v, err)) {
      if (!err.empty()) return err;
      if (!strata) return "the MPI peer takes its rank count from mpirun -np";
      auto n = to_int(v, 1, 4096);
      if (!n) return "-n must be a number of ranks from 1 to 4096, got '" + v + "'";
      o.nranks = *n;
    } else if (take(i, {"--iters"}, v, err)) {
      if (!err.empty()) return err;
      auto n = to_int(v, 1, 100000000);
      if (!n) return "--iters must be >= 1, got '" + v + "'";
      o.iters = *n;
    } else if (take(i, {"-b", "--minbytes"}, v, err)) {
      if (!err.empty()) return err;
      auto b = parse_bytes(v);
      if (!b) return "-b: " + b.status().message();
      // Sizes grow by multiplying: from 0 they never would.
      if (*b == 0) return "-b must be at least 1 byte, got '" + v + "'";
      o.min_bytes = *b;
    } else if (take(i, {"-e", "--maxbytes"}, v, err)) {
      if (!err.empty()) return err;
      auto b = parse_bytes(v);
      if (!b) return "-e: " + b.status().message();
      o.max_bytes = *b;
    } else if (take(i, {"-f", "--stepfactor"}, v, err)) {
      if (!err.empty()) return err;
      char* end = nullptr;
      double f = std::strtod(v.c_str(), &end);
      if (v.empty() || *end || !(f > 1.0) || f > 1024) return "-f must be a factor > 1, got '" + v + "'";
      o.factor = f;
    } else if (take(i, {"-d", "--dtype"}, v, err)) {
      if (!err.empty()) return err;
      auto d = parse_dtype(v);
      if (!d) return "unknown --dtype '" + v + "'";
      o.dtype = *d;
    } else if (take(i, {"-o", "--op"}, v, err)) {
      if (!err.empty()) return err;
      auto op = parse_op(v);
      if (!op) return "unknown --op '" + v + "' (sum prod min max avg)";
      o.op = *op;
    } else if (take(i, {"-r", "--root"}, v, err)) {
      root_given = true;
      if (!err.empty()) return err;
      auto r = to_int(v, 0, 1 << 20);
      if (!r) return "--root must be a rank, got '" + v + "'";
      o.root = *r;
    } else if (take(i, {"-w", "--warmup"}, v, err)) {
      if (!err.empty()) return err;
      auto w = to_int(v, 0, 1000000);
      if (!w) return "--warmup must be >= 0, got '" + v + "'";
      o.warmup = *w;
    } else if (take(i, {"--repeats"}, v, err)) {
      if (!err.empty()) return err;
      auto r = to_int(v, 1, 1000);
      if (!r) return "--repeats must be 1..1000, got '" + v + "'";
      o.repeats = *r;
    } else if (take(i, {"--target-ms"}, v, err)) {
      if (!err.empty()) return err;
      char* end = nullptr;
      double t = std::strtod(v.c_str(), &end);
      if (v.empty() || *end || !(t > 0)) return "--target-ms must be > 0, got '" + v + "'";
      o.target_ms = t;
    } else if (take(i, {"--max-iters"}, v, err)) {
      if (!err.empty()) return err;
      auto n = to_int(v, 1, 100000000);
      if (!n) return "--max-iters must be >= 1, got '" + v + "'";
      o.max_iters = *n;
    } else if (take(i, {"--json"}, v, err)) {
      if (!err.empty()) return err;
      o.json = v;
    } else if (take(i, {"--csv"}, v, err)) {
      if (!err.empty()) return err;
      o.csv = v;
    } else if (take(i, {"--neighbour"}, v, err)) {
      if (!err.empty()) return err;
      auto n = parse_neighbour(v);
      if (!n) return "--neighbour must be none, sleepy or busy, got '" + v + "'";
      o.neighbour = *n;
    } else if (take(i, {"--label"}, v, err)) {
      if (!err.empty()) return err;
      o.label = v;
    } else if (strata && take(i, {"--plot"}, v, err)) {
      if (!err.empty()) return err;
      o.plot = v;
    } else if (strata && take(i, {"--buffers"}, v, err)) {
      if (!err.empty()) return err;
      if (v == "heap") o.buffers = Buffers::Heap;
      else if (v == "external") o.buffers = Buffers::External;
      else if (v == "registered") o.buffers = Buffers::Registered;
      else return "--buffers must be heap, external or registered, got '" + v + "'";
    } else if (strata && take(i, {"--algorithm"}, v, err)) {
      if (!err.empty()) return err;
      if (v == "auto") o.algorithm = AlgoChoice::Auto;
      else if (v == "one_shot" || v == "oneshot") o.algorithm = AlgoChoice::OneShot;
      else if (v == "two_shot" || v == "twoshot") o.algorithm = AlgoChoice::TwoShot;
      else return "--algorithm must be auto, one_shot or two_shot, got '" + v + "'";
    } else if (strata && take(i, {"--worker-fds"}, v, err)) {
      if (!err.empty()) return err;
      if (std::sscanf(v.c_str(), "%d,%d", &o.worker_out_fd, &o.worker_err_fd) != 2) return "bad --worker-fds";
      o.worker = true;
    } else if (strata && arg == "--as-rank") {
      ++i;
      o.worker = true;
    } else if (!arg.empty() && arg[0] == '-') {
      return "unknown option '" + std::string(arg) + "'";
    } else if (!have_coll) {
      auto c = parse_coll(arg);
      if (!c) return "unknown collective '" + std::string(arg) + "'";
      o.coll = *c;
      have_coll = true;
      ++i;
    } else {
      return "unexpected argument '" + std::string(arg) + "'";
    }
  }
  if (!have_coll) return "missing the collective (e.g. all_reduce)";
  if (strata && o.nranks == 0 && !o.worker) return "missing -n N (the number of ranks)";
  if (o.min_bytes > o.max_bytes) return "-b (" + std::to_string(o.min_bytes) + ") is larger than -e";
  if (info(o.coll).reduces && o.op == ReduceOp::Avg && !info(o.dtype).floating)
    return "--op avg needs a floating --dtype";
  if (o.coll == Coll::SendRecv && o.inplace) return "sendrecv has no in-place form";
  if (strata && o.nranks > 0 && info(o.coll).rooted && o.root >= o.nranks)
    return "--root " + std::to_string(o.root) + " is not a rank of " + std::to_string(o.nranks);
  if (strata && o.nranks == 1 && o.coll == Coll::SendRecv) return "sendrecv needs -n 2 or more";
  // An option the collective would ignore is a mistake to name, not to run past.
  if (o.algorithm != AlgoChoice::Auto && o.coll != Coll::AllReduce)
    return std::string("--algorithm is for all_reduce; ") + info(o.coll).name + " chooses its own";
  if (root_given && !info(o.coll).rooted) return std::string("--root: ") + info(o.coll).name + " has no root";
  for (const auto& [opt, path] : {std::pair{"--json", &o.json}, {"--csv", &o.csv}, {"--plot", &o.plot}})
    if (std::string why = unwritable(opt, *path); !why.empty()) return why;
  return "";
}

}  // namespace strata::bench
