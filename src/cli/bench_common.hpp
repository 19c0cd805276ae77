#pragma once
// What `strata bench` and its Open MPI peer (bench/peers/mpi_bench.cpp) share, so that both
// measure the same sizes with the same method and write the same table, JSON and CSV: the
// command line, the collectives and their size conventions (nccl-tests), the data pattern and
// the expected result of every collective, the timing loop and the report formats.
// Header-only and independent of the library: the peer includes it without linking strata.
// bench/peers/torch_bench.py mirrors it in Python; keep the two in step.

#include <strata/types.hpp>  // DataType, ReduceOp (the enums only)

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace strata::bench {

// ---- collectives ------------------------------------------------------------------------------

enum class Coll { AllReduce, Reduce, Broadcast, AllGather, ReduceScatter, AllToAll, Gather, Scatter, Barrier, SendRecv };

struct CollInfo {
  Coll coll;
  const char* name;
  bool reduces;     // takes --op
  bool rooted;      // takes --root
  bool total_size;  // size = n × per-rank block (nccl-tests: all_gather, reduce_scatter, all_to_all, ...)
};

inline constexpr CollInfo kColls[] = {
    {Coll::AllReduce, "all_reduce", true, false, false},
    {Coll::Reduce, "reduce", true, true, false},
    {Coll::Broadcast, "broadcast", false, true, false},
    {Coll::AllGather, "all_gather", false, false, true},
    {Coll::ReduceScatter, "reduce_scatter", true, false, true},
    {Coll::AllToAll, "all_to_all", false, false, true},
    {Coll::Gather, "gather", false, true, true},
    {Coll::Scatter, "scatter", false, true, true},
    {Coll::Barrier, "barrier", false, false, false},
    {Coll::SendRecv, "sendrecv", false, false, false},
};

inline const CollInfo& info(Coll c) {
  for (const auto& i : kColls)
    if (i.coll == c) return i;
  return kColls[0];
}

inline std::optional<Coll> parse_coll(std::string_view s) {
  for (const auto& i : kColls)
    if (s == i.name) return i.coll;
  // The spellings of MPI, NCCL and torch.distributed are accepted too.
  if (s == "allreduce") return Coll::AllReduce;
  if (s == "allgather" || s == "all_gather_into_tensor") return Coll::AllGather;
  if (s == "reducescatter" || s == "reduce_scatter_tensor") return Coll::ReduceScatter;
  if (s == "alltoall" || s == "all_to_all_single") return Coll::AllToAll;
  if (s == "bcast") return Coll::Broadcast;
  return std::nullopt;
}

/// nccl-tests' bus bandwidth factor: busbw = algbw × factor, so that busbw is comparable with
/// the hardware's bandwidth whatever the rank count.
inline double busbw_factor(Coll c, int n) {
  double nd = n;
  switch (c) {
    case Coll::AllReduce: return 2.0 * (nd - 1) / nd;
    case Coll::AllGather:
    case Coll::ReduceScatter:
    case Coll::AllToAll:
    case Coll::Gather:
    case Coll::Scatter: return (nd - 1) / nd;
    case Coll::Reduce:
    case Coll::Broadcast:
    case Coll::SendRecv: return 1.0;
    case Coll::Barrier: return 0.0;
  }
  return 1.0;
}

/// Elements in the call's input and output on rank r (0: not read or not written there).
/// `c` is the count the call takes (the per-rank block for the total-size collectives).
inline size_t in_count(Coll coll, int n, int r, int root, size_t c) {
  switch (coll) {
    case Coll::ReduceScatter:
    case Coll::AllToAll: return c * n;
    case Coll::Scatter: return r == root ? c * n : 0;
    case Coll::Broadcast: return r == root ? c : 0;
    case Coll::Barrier: return 0;
    default: return c;
  }
}
inline size_t out_count(Coll coll, int n, int r, int root, size_t c) {
  switch (coll) {
    case Coll::AllGather:
    case Coll::AllToAll: return c * n;
    case Coll::Gather: return r == root ? c * n : 0;
    case Coll::Reduce: return r == root ? c : 0;
    case Coll::Barrier: return 0;
    default: return c;
  }
}

// ---- data types -------------------------------------------------------------------------------

struct TypeInfo {
  DataType dt;
  const char* name;
  size_t size;
  bool floating;
};
inline constexpr TypeInfo kTypes[] = {
    {DataType::Int8, "int8", 1, false},       {DataType::UInt8, "uint8", 1, false},
    {DataType::Int32, "int32", 4, false},     {DataType::UInt32, "uint32", 4, false},
    {DataType::Int64, "int64", 8, false},     {DataType::UInt64, "uint64", 8, false},
    {DataType::Float16, "float16", 2, true},  {DataType::BFloat16, "bfloat16", 2, true},
    {DataType::Float32, "float32", 4, true},  {DataType::Float64, "float64", 8, true},
};
inline const TypeInfo& info(DataType d) {
  for (const auto& t : kTypes)
    if (t.dt == d) return t;
  return kTypes[8];
}
inline std::optional<DataType> parse_dtype(std::string_view s) {
  for (const auto& t : kTypes)
    if (s == t.name) return t.dt;
  if (s == "float" || s == "fp32") return DataType::Float32;
  if (s == "double" || s == "fp64") return DataType::Float64;
  if (s == "half" || s == "fp16") return DataType::Float16;
  if (s == "bf16") return DataType::BFloat16;
  if (s == "int") return DataType::Int32;
  return std::nullopt;
}

inline constexpr const char* kOpNames[] = {"sum", "prod", "min", "max", "avg"};
inline const char* op_name(ReduceOp op) { return kOpNames[static_cast<int>(op)]; }
inline std::optional<ReduceOp> parse_op(std::string_view s) {
  for (int i = 0; i < 5; ++i)
    if (s == kOpNames[i]) return static_cast<ReduceOp>(i);
  return std::nullopt;
}

// Half-precision conversions of our own (round to nearest even), so the peer needs no library.
inline uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t e8 = (x >> 23) & 0xffu;
  uint32_t mant = x & 0x7fffffu;
  if (e8 == 0xff) return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0));
  int32_t e = static_cast<int32_t>(e8) - 127 + 15;
  if (e >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
  if (e <= 0) {
    if (e < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000u;
    uint32_t shift = static_cast<uint32_t>(14 - e);
    uint32_t h = mant >> shift, rem = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (h & 1))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  uint32_t h = sign | (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) ++h;  // a carry into the exponent is right
  return static_cast<uint16_t>(h);
}
inline float f16_to_f32(uint16_t h) {
  uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  uint32_t x;
  if (e == 0) {
    float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  if (e == 31) x = sign | 0x7f800000u | (mant << 13);
  else x = sign | ((e - 15 + 127) << 23) | (mant << 13);
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}
inline uint16_t f32_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1)) >> 16);
}
inline float bf16_to_f32(uint16_t h) {
  uint32_t x = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

struct F16 {
  uint16_t bits;
};
struct BF16 {
  uint16_t bits;
};

/// Calls f(T{}) with the storage type of `dt` (F16/BF16 for the half types).
template <class F>
decltype(auto) with_type(DataType dt, F&& f) {
  switch (dt) {
    case DataType::Int8: return f(int8_t{});
    case DataType::UInt8: return f(uint8_t{});
    case DataType::Int32: return f(int32_t{});
    case DataType::UInt32: return f(uint32_t{});
    case DataType::Int64: return f(int64_t{});
    case DataType::UInt64: return f(uint64_t{});
    case DataType::Float16: return f(F16{});
    case DataType::BFloat16: return f(BF16{});
    case DataType::Float64: return f(double{});
    case DataType::Float32: break;
  }
  return f(float{});
}

template <class T>
inline T from_double(double v) {
  if constexpr (std::is_same_v<T, F16>) return F16{f32_to_f16(static_cast<float>(v))};
  else if constexpr (std::is_same_v<T, BF16>) return BF16{f32_to_bf16(static_cast<float>(v))};
  else if constexpr (std::is_integral_v<T>) return static_cast<T>(static_cast<int64_t>(v));  // wraps
  else return static_cast<T>(v);
}
template <class T>
inline double to_double(T v) {
  if constexpr (std::is_same_v<T, F16>) return f16_to_f32(v.bits);
  else if constexpr (std::is_same_v<T, BF16>) return bf16_to_f32(v.bits);
  else return static_cast<double>(v);
}

// ---- data pattern and expected results --------------------------------------------------------
// Small integers, so sums are exact in every type (float16 and int8 included, up to 11 ranks);
// distinct per rank for up to 11 ranks, so a block landing at the wrong place is seen.

inline double pattern(ReduceOp op, int rank, size_t i) {
  size_t v = (static_cast<size_t>(rank) * 7 + i) % 11;
  if (op == ReduceOp::Prod) return v % 3 == 0 ? 2.0 : 1.0;
  return static_cast<double>(v + 1);
}

/// Reduction over ranks 0..n-1 of pattern(op, b, i).
inline double reduced(ReduceOp op, int n, size_t i) {
  double acc = pattern(op, 0, i);
  for (int b = 1; b < n; ++b) {
    double v = pattern(op, b, i);
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg: acc += v; break;
      case ReduceOp::Prod: acc *= v; break;
      case ReduceOp::Min: acc = std::min(acc, v); break;
      case ReduceOp::Max: acc = std::max(acc, v); break;
    }
  }
  return op == ReduceOp::Avg ? acc / n : acc;
}

/// Expected value of output element k on rank r; nullopt where the output is not defined.
/// `c` is the count the call takes. The input of rank b is pattern(op, b, i) at index i.
inline std::optional<double> expected(Coll coll, ReduceOp op, int n, int r, int root, size_t c, size_t k) {
  switch (coll) {
    case Coll::AllReduce: return reduced(op, n, k);
    case Coll::Reduce:
      if (r != root) return std::nullopt;
      return reduced(op, n, k);
    case Coll::Broadcast: return pattern(op, root, k);
    case Coll::AllGather: return pattern(op, static_cast<int>(k / c), k % c);
    case Coll::ReduceScatter: return reduced(op, n, static_cast<size_t>(r) * c + k);
    case Coll::AllToAll: return pattern(op, static_cast<int>(k / c), static_cast<size_t>(r) * c + k % c);
    case Coll::Gather:
      if (r != root) return std::nullopt;
      return pattern(op, static_cast<int>(k / c), k % c);
    case Coll::Scatter: return pattern(op, root, static_cast<size_t>(r) * c + k);
    case Coll::SendRecv: return pattern(op, (r + n - 1) % n, k);
    case Coll::Barrier: return std::nullopt;
  }
  return std::nullopt;
}

/// Writes value(i) to p[i] for i in [0, count), in the storage type of dt.
template <class Value>
void fill(DataType dt, void* p, size_t count, Value&& value) {
  with_type(dt, [&](auto tag) {
    using T = decltype(tag);
    T* d = static_cast<T*>(p);
    for (size_t i = 0; i < count; ++i) d[i] = from_double<T>(value(i));
  });
}

struct CheckResult {
  size_t wrong = 0;
  size_t first = 0;  // index of the first wrong element
  double got = 0, want = 0;
};

/// Compares p[0..count) with want(k) (integers exactly, floating types within rounding).
template <class Want>
CheckResult check(DataType dt, const void* p, size_t count, Want&& want) {
  CheckResult res;
  with_type(dt, [&](auto tag) {
    using T = decltype(tag);
    const T* d = static_cast<const T*>(p);
    double tol = std::is_same_v<T, float> ? 1e-6 : std::is_same_v<T, double> ? 1e-12 : 1e-2;
    for (size_t k = 0; k < count; ++k) {
      double w = want(k);
      double g = to_double(d[k]);
      bool ok;
      if constexpr (std::is_integral_v<T>) ok = d[k] == from_double<T>(w);
      else ok = std::fabs(g - w) <= tol * std::max(1.0, std::fabs(w));
      if (!ok) {
        if (res.wrong == 0) {
          res.first = k;
          res.got = g;
          res.want = std::is_integral_v<T> ? to_double(from_double<T>(w)) : w;
        }
        ++res.wrong;
      }
    }
  });
  return res;
}

/// Sentinel written to outputs before the checked call: a value no collective produces here.
inline constexpr double kSentinel = -3.0;

// ---- command line -----------------------------------------------------------------------------

enum class Tool { Strata, Mpi };
enum class Buffers { Heap, External, Registered };
inline const char* buffers_name(Buffers b) {
  return b == Buffers::Heap ? "heap" : b == Buffers::External ? "external" : "registered";
}
enum class AlgoChoice { Auto, OneShot, TwoShot };
inline const char* algo_name(AlgoChoice a) {
  return a == AlgoChoice::Auto ? "auto" : a == AlgoChoice::OneShot ? "one_shot" : "two_shot";
}

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
  std::string json, csv, plot, label;
  // strata bench internals: descriptors the launcher side hands its worker ranks.
  int worker_out_fd = -1, worker_err_fd = -1;
  bool worker = false;
};

/// "8", "64K", "256M", "1G" (binary multiples; K/KiB/KB all mean 1024, as in nccl-tests).
inline std::optional<size_t> parse_bytes(std::string_view s) {
  size_t i = 0;
  uint64_t v = 0;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
    if (v > (uint64_t{1} << 50)) return std::nullopt;
    v = v * 10 + static_cast<uint64_t>(s[i] - '0');
    ++i;
  }
  if (i == 0) return std::nullopt;
  std::string_view suf = s.substr(i);
  int shift = 0;
  if (suf.empty() || suf == "B") shift = 0;
  else if (suf == "K" || suf == "k" || suf == "KB" || suf == "KiB") shift = 10;
  else if (suf == "M" || suf == "m" || suf == "MB" || suf == "MiB") shift = 20;
  else if (suf == "G" || suf == "g" || suf == "GB" || suf == "GiB") shift = 30;
  else return std::nullopt;
  if (v > (uint64_t{1} << (50 - shift))) return std::nullopt;
  return static_cast<size_t>(v << shift);
}

/// "256 MiB", "8 KiB", "12 B": sizes as people read them.
inline std::string human_bytes(size_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB"};
  int u = 0;
  while (u < 3 && b >= 1024 && b % 1024 == 0) b /= 1024, ++u;
  return std::to_string(b) + " " + units[u];
}

inline std::string usage_text(Tool tool) {
  std::string prog = tool == Tool::Strata ? "strata bench" : "mpirun -np N mpi_bench";
  std::string u = "usage: " + prog + " COLLECTIVE" + (tool == Tool::Strata ? " -n N" : "") +
                  " [-b MIN] [-e MAX] [-f FACTOR] [options]\n"
                  "\n"
                  "COLLECTIVE: all_reduce reduce broadcast all_gather reduce_scatter all_to_all gather\n"
                  "            scatter barrier sendrecv\n"
                  "\n"
                  "Sizes (as nccl-tests): -b/-e are message sizes in bytes, K/M/G suffixes (binary).\n"
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
  u +=
      "  -b, --minbytes S    smallest size (default 8)\n"
      "  -e, --maxbytes S    largest size (default 64M)\n"
      "  -f, --stepfactor F  multiply the size by F per step (default 2)\n"
      "  -d, --dtype T       int8 uint8 int32 uint32 int64 uint64 float16 bfloat16 float32 float64\n"
      "                      (default float32)\n"
      "  -o, --op OP         sum prod min max avg (default sum)\n"
      "  -r, --root R        root of reduce, broadcast, gather, scatter (default 0)\n"
      "  --inplace           in-place layout (MPI's; see docs/SEMANTICS.md)\n";
  if (tool == Tool::Strata)
    u +=
        "  --buffers B         heap (registered on allocation), external (malloc'd, staged) or\n"
        "                      registered (malloc'd + register_buffer, single-copy CMA); default heap\n"
        "  --algorithm A       auto, one_shot, two_shot (all_reduce; default auto)\n";
  u +=
      "  --iters K           timed calls per repeat (default: as many as fit in --target-ms,\n"
      "                      1..--max-iters)\n"
      "  -w, --warmup W      untimed calls per size before timing (default 5)\n"
      "  --repeats R         timed repeats per size; the median is reported (default 7)\n"
      "  --target-ms T       length of one repeat when --iters is not given (default 20)\n"
      "  --max-iters K       cap on the automatic iteration count (default 10000)\n"
      "  --no-check          skip the correctness check\n"
      "  --json FILE         write the results as one JSON document\n"
      "  --csv FILE          write the results as CSV\n";
  if (tool == Tool::Strata) u += "  --plot FILE.png     plot busbw and time vs size (needs python3 with matplotlib)\n";
  u +=
      "  --label NAME        system name in the JSON/CSV (default " +
      std::string(tool == Tool::Strata ? "strata-<buffers>" : "openmpi") +
      ")\n"
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

/// Parses argv[first..argc). Returns an error message ("" when fine); sets `help` for -h.
/// -n is the rank count (strata bench); the MPI peer refuses it, mpirun -np sets the ranks.
inline std::string parse_options(int argc, char** argv, int first, Tool tool, Options& o, bool& help) {
  help = false;
  bool have_coll = false;
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
    char* end = nullptr;
    long v = std::strtol(s.c_str(), &end, 10);
    if (s.empty() || *end || v < lo || v > hi) return std::nullopt;
    return static_cast<int>(v);
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
      if (!n) return "-n must be a number of ranks >= 1, got '" + v + "'";
      o.nranks = *n;
    } else if (take(i, {"--iters"}, v, err)) {
      if (!err.empty()) return err;
      auto n = to_int(v, 1, 100000000);
      if (!n) return "--iters must be >= 1, got '" + v + "'";
      o.iters = *n;
    } else if (take(i, {"-b", "--minbytes"}, v, err)) {
      if (!err.empty()) return err;
      auto b = parse_bytes(v);
      if (!b) return "-b must be a size such as 8, 64K, 256M, got '" + v + "'";
      o.min_bytes = *b;
    } else if (take(i, {"-e", "--maxbytes"}, v, err)) {
      if (!err.empty()) return err;
      auto b = parse_bytes(v);
      if (!b) return "-e must be a size such as 8, 64K, 256M, got '" + v + "'";
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
  return "";
}

// ---- sizes ------------------------------------------------------------------------------------

struct SizePoint {
  size_t bytes;  // what the row reports (nccl-tests: total for the total-size collectives)
  size_t count;  // elements in `bytes`
  size_t c;      // count the call takes (per-rank block for the total-size collectives)
};

inline std::vector<SizePoint> sizes(const Options& o, int n) {
  std::vector<SizePoint> out;
  size_t es = info(o.dtype).size;
  if (o.coll == Coll::Barrier) return {{0, 0, 0}};
  double s = static_cast<double>(o.min_bytes);
  while (s <= static_cast<double>(o.max_bytes) + 0.5) {
    size_t b = static_cast<size_t>(s);
    size_t c = info(o.coll).total_size ? std::max<size_t>(1, b / (es * n)) : std::max<size_t>(1, b / es);
    size_t count = info(o.coll).total_size ? c * n : c;
    if (out.empty() || out.back().c != c) out.push_back({count * es, count, c});
    s *= o.factor;
  }
  return out;
}

// ---- timing -----------------------------------------------------------------------------------

struct Timing {
  int iters = 0;
  std::vector<double> seconds;  // per repeat: loop time / iters, the slowest rank's
  double median = 0, min = 0, max = 0;
};

inline double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

/// The method, shared by strata bench and the MPI peer: `warmup` untimed calls; one timed call
/// sizes the loop (unless --iters); then `repeats` times: barrier, time `iters` back-to-back
/// calls, divide. max_all(v, k) replaces v[0..k) by the maximum over ranks.
template <class Op, class Barrier, class MaxAll>
Timing measure(const Options& o, Op&& op, Barrier&& barrier, MaxAll&& max_all) {
  using Clock = std::chrono::steady_clock;
  for (int i = 0; i < o.warmup; ++i) op();
  Timing t;
  t.iters = o.iters;
  if (t.iters <= 0) {
    barrier();
    auto t0 = Clock::now();
    op();
    double one = std::chrono::duration<double>(Clock::now() - t0).count();
    max_all(&one, 1);
    double want = o.target_ms * 1e-3 / std::max(one, 1e-9);
    t.iters = static_cast<int>(std::clamp(std::ceil(want), 1.0, static_cast<double>(o.max_iters)));
  }
  t.seconds.assign(static_cast<size_t>(o.repeats), 0.0);
  for (int r = 0; r < o.repeats; ++r) {
    barrier();
    auto t0 = Clock::now();
    for (int i = 0; i < t.iters; ++i) op();
    t.seconds[static_cast<size_t>(r)] = std::chrono::duration<double>(Clock::now() - t0).count() / t.iters;
  }
  max_all(t.seconds.data(), o.repeats);
  t.median = median_of(t.seconds);
  t.min = *std::min_element(t.seconds.begin(), t.seconds.end());
  t.max = *std::max_element(t.seconds.begin(), t.seconds.end());
  return t;
}

// ---- reports ----------------------------------------------------------------------------------

struct Row {
  size_t bytes = 0, count = 0;
  int iters = 0;
  double time_us = 0, time_min_us = 0, time_max_us = 0;
  double algbw = 0, busbw = 0;  // GB/s (1e9 bytes per second)
  bool checked = false;
  size_t wrong = 0;
};

struct RunInfo {
  std::string system;  // strata, openmpi
  std::string label;   // strata-heap, openmpi-malloc-tuned, ...
  Options opts;
  int nranks = 0;
};

inline Row make_row(const RunInfo& ri, const SizePoint& sp, const Timing& t, bool checked, size_t wrong) {
  Row row;
  row.bytes = sp.bytes;
  row.count = sp.count;
  row.iters = t.iters;
  row.time_us = t.median * 1e6;
  row.time_min_us = t.min * 1e6;
  row.time_max_us = t.max * 1e6;
  row.algbw = t.median > 0 ? static_cast<double>(sp.bytes) / t.median / 1e9 : 0;
  row.busbw = row.algbw * busbw_factor(ri.opts.coll, ri.nranks);
  row.checked = checked;
  row.wrong = wrong;
  return row;
}

inline std::string table_header(const RunInfo& ri) {
  const Options& o = ri.opts;
  const CollInfo& ci = info(o.coll);
  char buf[1024];
  std::string h;
  std::snprintf(buf, sizeof buf, "# %s %s: %d ranks, %s%s%s, %s", ri.system.c_str(), ci.name, ri.nranks,
                info(o.dtype).name, ci.reduces ? " " : "", ci.reduces ? op_name(o.op) : "",
                o.inplace ? "in place" : "out of place");
  h += buf;
  if (ri.system == "strata")
    h += std::string(", ") + buffers_name(o.buffers) + " buffers, algorithm " + algo_name(o.algorithm);
  if (ci.rooted) h += ", root " + std::to_string(o.root);
  h += "  [" + ri.label + "]\n";
  std::snprintf(buf, sizeof buf,
                "# time: median of %d repeats of (a timed loop of `iters` back-to-back calls / iters), each "
                "repeat the slowest rank's; %d warm-up calls per size\n",
                o.repeats, o.warmup);
  h += buf;
  h += ci.total_size ? "# size: total buffer = ranks x per-rank block (nccl-tests)\n"
                     : "# size: the buffer each rank passes (nccl-tests)\n";
  h += "#\n";
  std::snprintf(buf, sizeof buf, "# %12s %12s %9s %6s %5s %7s %11s %11s %11s %11s %6s\n", "size(B)", "count", "type",
                "redop", "root", "iters", "time(us)", "min(us)", "algbw(GB/s)", "busbw(GB/s)", "check");
  h += buf;
  return h;
}

inline std::string table_row(const RunInfo& ri, const Row& r) {
  const CollInfo& ci = info(ri.opts.coll);
  char buf[512];
  std::string root = ci.rooted ? std::to_string(ri.opts.root) : "-";
  std::snprintf(buf, sizeof buf, "  %12zu %12zu %9s %6s %5s %7d %11.2f %11.2f %11.3f %11.3f %6s\n", r.bytes, r.count,
                info(ri.opts.dtype).name, ci.reduces ? op_name(ri.opts.op) : "-", root.c_str(), r.iters, r.time_us,
                r.time_min_us, r.algbw, r.busbw, !r.checked ? "-" : r.wrong ? "FAIL" : "ok");
  return buf;
}

inline std::string json_escape(const std::string& s) {
  std::string o;
  for (char ch : s) {
    if (ch == '"' || ch == '\\') o += '\\', o += ch;
    else if (static_cast<unsigned char>(ch) < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", ch);
      o += b;
    } else o += ch;
  }
  return o;
}

inline std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char b[64];
  std::snprintf(b, sizeof b, "%.6g", v);
  return b;
}

/// One JSON document; `extra` is inserted as further top-level members ("\"k\": v, ...").
inline std::string to_json(const RunInfo& ri, const std::vector<Row>& rows, const std::string& extra = "") {
  const Options& o = ri.opts;
  const CollInfo& ci = info(o.coll);
  std::string j = "{\n";
  j += "  \"format\": \"strata-bench/1\",\n";
  j += "  \"system\": \"" + json_escape(ri.system) + "\",\n";
  j += "  \"label\": \"" + json_escape(ri.label) + "\",\n";
  j += "  \"collective\": \"" + std::string(ci.name) + "\",\n";
  j += "  \"nranks\": " + std::to_string(ri.nranks) + ",\n";
  j += "  \"dtype\": \"" + std::string(info(o.dtype).name) + "\",\n";
  j += "  \"op\": \"" + std::string(ci.reduces ? op_name(o.op) : "none") + "\",\n";
  j += "  \"root\": " + std::to_string(ci.rooted ? o.root : -1) + ",\n";
  j += std::string("  \"inplace\": ") + (o.inplace ? "true" : "false") + ",\n";
  j += "  \"buffers\": \"" + std::string(ri.system == "strata" ? buffers_name(o.buffers) : "malloc") + "\",\n";
  j += "  \"algorithm\": \"" + std::string(ri.system == "strata" ? algo_name(o.algorithm) : "library") + "\",\n";
  j += "  \"busbw_factor\": " + json_number(busbw_factor(o.coll, ri.nranks)) + ",\n";
  j += "  \"size_meaning\": \"" +
       std::string(ci.total_size ? "total buffer (ranks x per-rank block)" : "buffer per rank") + "\",\n";
  j += "  \"timing\": {\"method\": \"median over repeats of loop time / iters, slowest rank per repeat\", "
       "\"warmup\": " +
       std::to_string(o.warmup) + ", \"repeats\": " + std::to_string(o.repeats) +
       ", \"iters\": " + (o.iters > 0 ? std::to_string(o.iters) : std::string("\"auto\"")) +
       ", \"target_ms\": " + json_number(o.target_ms) + ", \"max_iters\": " + std::to_string(o.max_iters) + "},\n";
  if (!extra.empty()) j += "  " + extra + ",\n";
  j += "  \"results\": [";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    j += i ? ",\n    " : "\n    ";
    j += "{\"size\": " + std::to_string(r.bytes) + ", \"count\": " + std::to_string(r.count) +
         ", \"iters\": " + std::to_string(r.iters) + ", \"time_us\": " + json_number(r.time_us) +
         ", \"time_min_us\": " + json_number(r.time_min_us) + ", \"time_max_us\": " + json_number(r.time_max_us) +
         ", \"algbw_gbs\": " + json_number(r.algbw) + ", \"busbw_gbs\": " + json_number(r.busbw) +
         ", \"check\": \"" + (!r.checked ? "skipped" : r.wrong ? "FAIL" : "ok") +
         "\", \"wrong\": " + std::to_string(r.wrong) + "}";
  }
  j += "\n  ]\n}\n";
  return j;
}

inline constexpr const char* kCsvHeader =
    "system,label,collective,nranks,dtype,op,inplace,buffers,size,count,iters,time_us,time_min_us,time_max_us,"
    "algbw_gbs,busbw_gbs,check\n";

inline std::string to_csv(const RunInfo& ri, const std::vector<Row>& rows) {
  const Options& o = ri.opts;
  const CollInfo& ci = info(o.coll);
  std::string s = kCsvHeader;
  for (const Row& r : rows) {
    char buf[512];
    std::snprintf(buf, sizeof buf, "%s,%s,%s,%d,%s,%s,%d,%s,%zu,%zu,%d,%.4f,%.4f,%.4f,%.5f,%.5f,%s\n",
                  ri.system.c_str(), ri.label.c_str(), ci.name, ri.nranks, info(o.dtype).name,
                  ci.reduces ? op_name(o.op) : "none", o.inplace ? 1 : 0,
                  ri.system == "strata" ? buffers_name(o.buffers) : "malloc", r.bytes, r.count, r.iters, r.time_us,
                  r.time_min_us, r.time_max_us, r.algbw, r.busbw, !r.checked ? "skipped" : r.wrong ? "FAIL" : "ok");
    s += buf;
  }
  return s;
}

/// Writes `data` to `path`; false (errno set) on failure.
inline bool write_file(const std::string& path, const std::string& data) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return false;
  bool ok = std::fwrite(data.data(), 1, data.size(), f) == data.size();
  ok = (std::fclose(f) == 0) && ok;
  return ok;
}

}  // namespace strata::bench
