// The Open MPI peer of `strata bench`: the same collectives, sizes, timing loop, check and
// output formats (src/cli/bench_common.hpp is shared), with MPI's collectives on malloc'd
// buffers allocated once at the largest size and touched before timing.
//
//   mpirun --allow-run-as-root --oversubscribe -np 2 mpi_bench all_reduce -b 8 -e 256M -f 2 --json f.json
//
// Only the C API of MPI is used. Types: int8 uint8 int32 uint32 int64 uint64 float32 float64;
// ops: sum prod min max (MPI has no avg, nor a portable float16/bfloat16).

#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cli/bench_common.hpp"

namespace {

using namespace strata;
using namespace strata::bench;

MPI_Datatype mpi_type(DataType dt) {
  switch (dt) {
    case DataType::Int8: return MPI_INT8_T;
    case DataType::UInt8: return MPI_UINT8_T;
    case DataType::Int32: return MPI_INT32_T;
    case DataType::UInt32: return MPI_UINT32_T;
    case DataType::Int64: return MPI_INT64_T;
    case DataType::UInt64: return MPI_UINT64_T;
    case DataType::Float64: return MPI_DOUBLE;
    case DataType::Float32: return MPI_FLOAT;
    default: return MPI_DATATYPE_NULL;
  }
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return MPI_SUM;
    case ReduceOp::Prod: return MPI_PROD;
    case ReduceOp::Min: return MPI_MIN;
    case ReduceOp::Max: return MPI_MAX;
    default: return MPI_OP_NULL;
  }
}

void write_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::write(fd, s.data() + off, s.size() - off);
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

class MpiBench {
 public:
  explicit MpiBench(const Options& o) : o_(o) {
    MPI_Comm_rank(MPI_COMM_WORLD, &r_);
    MPI_Comm_size(MPI_COMM_WORLD, &n_);
    ri_.system = "openmpi";
    ri_.label = o_.label.empty() ? "openmpi" : o_.label;
    ri_.opts = o_;
    ri_.nranks = n_;
    dt_ = mpi_type(o_.dtype);
    op_ = mpi_op(o_.op);
  }
  ~MpiBench() {
    std::free(in_);
    std::free(out_);
  }
  int run();

 private:
  struct Call {
    void* in;  // MPI_IN_PLACE where the layout is in place
    void* out;
    size_t c;
    void* check_out;  // where this rank's result lies
  };
  Call make_call(const SizePoint& sp);
  void call(const Call& c);
  size_t check_size(const SizePoint& sp, const Call& c);

  Options o_;
  RunInfo ri_;
  int r_ = 0, n_ = 0;
  MPI_Datatype dt_;
  MPI_Op op_;
  char* in_ = nullptr;
  char* out_ = nullptr;
};

// MPI's in-place conventions: MPI_IN_PLACE as the send buffer (the receive buffer for scatter
// at the root); reduce_scatter_block in place leaves the result at the start of recvbuf.
MpiBench::Call MpiBench::make_call(const SizePoint& sp) {
  Call c{in_, out_, sp.c, out_};
  if (!o_.inplace) return c;
  switch (o_.coll) {
    case Coll::AllReduce:
    case Coll::AllGather:
    case Coll::AllToAll: c.in = MPI_IN_PLACE; break;
    case Coll::ReduceScatter:
      c.in = MPI_IN_PLACE;
      c.out = in_;  // holds the whole input; the result lands in its first block
      c.check_out = in_;
      break;
    case Coll::Reduce:
    case Coll::Gather:
      if (r_ == o_.root) c.in = MPI_IN_PLACE;
      break;
    case Coll::Scatter:
      if (r_ == o_.root) {
        c.out = MPI_IN_PLACE;
        c.check_out = in_ + static_cast<size_t>(o_.root) * sp.c * info(o_.dtype).size;
      }
      break;
    default: break;
  }
  return c;
}

void MpiBench::call(const Call& c) {
  int cnt = static_cast<int>(c.c);
  int next = (r_ + 1) % n_, prev = (r_ + n_ - 1) % n_;
  switch (o_.coll) {
    case Coll::AllReduce: MPI_Allreduce(c.in, c.out, cnt, dt_, op_, MPI_COMM_WORLD); break;
    case Coll::Reduce: MPI_Reduce(c.in, c.out, cnt, dt_, op_, o_.root, MPI_COMM_WORLD); break;
    case Coll::Broadcast: MPI_Bcast(c.out, cnt, dt_, o_.root, MPI_COMM_WORLD); break;
    case Coll::AllGather: MPI_Allgather(c.in, cnt, dt_, c.out, cnt, dt_, MPI_COMM_WORLD); break;
    case Coll::ReduceScatter: MPI_Reduce_scatter_block(c.in, c.out, cnt, dt_, op_, MPI_COMM_WORLD); break;
    case Coll::AllToAll: MPI_Alltoall(c.in, cnt, dt_, c.out, cnt, dt_, MPI_COMM_WORLD); break;
    case Coll::Gather: MPI_Gather(c.in, cnt, dt_, c.out, cnt, dt_, o_.root, MPI_COMM_WORLD); break;
    case Coll::Scatter: MPI_Scatter(c.in, cnt, dt_, c.out, cnt, dt_, o_.root, MPI_COMM_WORLD); break;
    case Coll::Barrier: MPI_Barrier(MPI_COMM_WORLD); break;
    case Coll::SendRecv:
      MPI_Sendrecv(c.in, cnt, dt_, next, 0, c.out, cnt, dt_, prev, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      break;
  }
}

size_t MpiBench::check_size(const SizePoint& sp, const Call& c) {
  const int root = o_.root;
  size_t es = info(o_.dtype).size;
  size_t oc = out_count(o_.coll, n_, r_, root, sp.c);
  size_t ic = in_count(o_.coll, n_, r_, root, sp.c);
  // Where this rank's input lies in MPI's layout.
  char* in = in_;
  if (o_.inplace) {
    switch (o_.coll) {
      case Coll::AllReduce:
      case Coll::AllToAll:
      case Coll::Reduce: in = (o_.coll != Coll::Reduce || r_ == root) ? out_ : in_; break;
      case Coll::AllGather: in = out_ + static_cast<size_t>(r_) * sp.c * es; break;
      case Coll::Gather: in = r_ == root ? out_ + static_cast<size_t>(root) * sp.c * es : in_; break;
      default: break;
    }
  }
  if (o_.coll == Coll::Broadcast) in = out_;  // MPI_Bcast has one buffer
  if (oc && c.check_out != MPI_IN_PLACE) fill(o_.dtype, c.check_out, oc, [](size_t) { return kSentinel; });
  if (ic) fill(o_.dtype, in, ic, [&](size_t i) { return pattern(o_.op, r_, i); });
  call(c);
  if (!oc) return 0;
  CheckResult res = check(o_.dtype, c.check_out, oc, [&](size_t k) {
    return expected(o_.coll, o_.op, n_, r_, root, sp.c, k).value_or(kSentinel);
  });
  if (res.wrong)
    std::fprintf(stderr,
                 "mpi_bench: rank %d: %s %zu B: %zu of %zu output elements wrong; first at index %zu: got %g, "
                 "expected %g\n",
                 r_, info(o_.coll).name, sp.bytes, res.wrong, oc, res.first, res.got, res.want);
  return res.wrong;
}

int MpiBench::run() {
  if (dt_ == MPI_DATATYPE_NULL) {
    if (r_ == 0) std::fprintf(stderr, "mpi_bench: --dtype %s has no MPI type here\n", info(o_.dtype).name);
    return 2;
  }
  if (info(o_.coll).reduces && op_ == MPI_OP_NULL) {
    if (r_ == 0) std::fprintf(stderr, "mpi_bench: MPI has no --op %s\n", op_name(o_.op));
    return 2;
  }
  if ((info(o_.coll).rooted && o_.root >= n_) || (o_.coll == Coll::SendRecv && n_ < 2)) {
    if (r_ == 0) std::fprintf(stderr, "mpi_bench: bad --root or too few ranks\n");
    return 2;
  }
  std::vector<SizePoint> pts = sizes(o_, n_);
  size_t bytes = 64;
  for (const auto& p : pts) bytes = std::max(bytes, p.bytes);
  bytes = (bytes + 4095) / 4096 * 4096;
  in_ = static_cast<char*>(std::aligned_alloc(4096, bytes));
  out_ = static_cast<char*>(std::aligned_alloc(4096, bytes));
  if (!in_ || !out_) {
    std::fprintf(stderr, "mpi_bench: cannot allocate 2 x %zu bytes\n", bytes);
    return 1;
  }
  std::memset(in_, 0, bytes);  // first touch, once
  std::memset(out_, 0, bytes);
  if (r_ == 0) write_all(STDOUT_FILENO, table_header(ri_));

  std::vector<Row> rows;
  size_t failed = 0;
  for (size_t k = 0; k < pts.size(); ++k) {
    const SizePoint& sp = pts[k];
    if (r_ == 0 && !o_.quiet && pts.size() > 1)
      std::fprintf(stderr, "mpi_bench: [%zu/%zu] %s %s\n", k + 1, pts.size(), info(o_.coll).name,
                   human_bytes(sp.bytes).c_str());
    Call c = make_call(sp);
    double wrong = o_.check ? static_cast<double>(check_size(sp, c)) : 0;
    auto max_all = [](double* v, int m) { MPI_Allreduce(MPI_IN_PLACE, v, m, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD); };
    Timing t = measure(
        o_, [&] { call(c); }, [] { MPI_Barrier(MPI_COMM_WORLD); }, max_all);
    if (o_.check) max_all(&wrong, 1);
    Row row = make_row(ri_, sp, t, o_.check && o_.coll != Coll::Barrier, static_cast<size_t>(wrong));
    if (row.wrong) ++failed;
    rows.push_back(row);
    if (r_ == 0) write_all(STDOUT_FILENO, table_row(ri_, row));
  }
  int rc = failed ? 1 : 0;
  if (r_ == 0) {
    std::string foot = "#\n";
    if (!o_.check || o_.coll == Coll::Barrier) foot += "# check: not done\n";
    else if (failed)
      foot += "# check: FAIL at " + std::to_string(failed) + " of " + std::to_string(rows.size()) + " sizes\n";
    else foot += "# check: all " + std::to_string(rows.size()) + " sizes ok\n";
    write_all(STDOUT_FILENO, foot);
    char lib[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(lib, &len);
    std::string version(lib, static_cast<size_t>(len));
    if (auto cut = version.find_first_of(",\n"); cut != std::string::npos) version.resize(cut);
    std::string extra = "\"library\": \"" + json_escape(version) + "\"";
    if (!o_.json.empty() && !write_file(o_.json, to_json(ri_, rows, extra))) {
      std::fprintf(stderr, "mpi_bench: cannot write %s\n", o_.json.c_str());
      rc = 1;
    }
    if (!o_.csv.empty() && !write_file(o_.csv, to_csv(ri_, rows))) {
      std::fprintf(stderr, "mpi_bench: cannot write %s\n", o_.csv.c_str());
      rc = 1;
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  // The neighbour is forked before MPI_Init, while this process is still single-threaded (the
  // child starts threads); mpirun tells each rank its number in the environment.
  NeighbourProcess neighbour;
  {
    Options pre;
    bool pre_help = false;
    const char* world_rank = std::getenv("OMPI_COMM_WORLD_RANK");
    if (parse_options(argc, argv, 1, Tool::Mpi, pre, pre_help).empty() && !pre_help &&
        pre.neighbour != Neighbour::None && (!world_rank || std::strcmp(world_rank, "0") == 0)) {
      std::string nerr = neighbour.start(pre.neighbour);
      if (!nerr.empty()) std::fprintf(stderr, "mpi_bench: %s\n", nerr.c_str());
      else
        std::printf("# neighbour: %s (pid %d)\n", neighbour_description(pre.neighbour, neighbour.threads()).c_str(),
                    static_cast<int>(neighbour.pid()));
      std::fflush(stdout);
    }
  }
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  Options o;
  bool help = false;
  std::string err = parse_options(argc, argv, 1, Tool::Mpi, o, help);
  int rc = 0;
  if (help) {
    if (rank == 0) std::fputs(usage_text(Tool::Mpi).c_str(), stdout);
  } else if (!err.empty()) {
    if (rank == 0) std::fprintf(stderr, "mpi_bench: %s (try --help)\n", err.c_str());
    rc = 2;
  } else {
    MpiBench b(o);
    rc = b.run();
  }
  MPI_Finalize();
  neighbour.stop();
  return rc;
}
