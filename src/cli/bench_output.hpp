#pragma once
// The reports of `strata bench` and of its Open MPI peer: the table (nccl-tests' columns),
// one JSON document ("strata-bench/1") and CSV, identical on both sides so that
// scripts/perf_report.py reads either.

#include <cstddef>
#include <string>
#include <vector>

#include "cli/bench_sweep.hpp"

namespace strata::bench {

/// One row of the report: a size and its figures.
struct Row {
  size_t bytes = 0, count = 0;
  int iters = 0;
  double time_us = 0, time_min_us = 0, time_max_us = 0;
  double algbw = 0, busbw = 0;  // GB/s (1e9 bytes per second)
  bool checked = false;
  size_t wrong = 0;
};

/// What the report says about the run as a whole.
struct RunInfo {
  std::string system;  // strata, openmpi
  std::string label;   // strata-heap, openmpi-malloc-tuned, ...
  Options opts;
  int nranks = 0;
};

/// The row of `sp` timed as `t` (algbw, busbw from nccl-tests' definitions).
Row make_row(const RunInfo& ri, const SizePoint& sp, const Timing& t, bool checked, size_t wrong);
/// The comment lines above the table: the run, the method and the column names.
std::string table_header(const RunInfo& ri);
/// One line of the table.
std::string table_row(const RunInfo& ri, const Row& r);
/// `s` with quotes, backslashes and control characters escaped for a JSON string.
std::string json_escape(const std::string& s);
/// `v` as a JSON number ("null" when not finite).
std::string json_number(double v);
/// One JSON document; `extra` is inserted as further top-level members ("\"k\": v, ...").
std::string to_json(const RunInfo& ri, const std::vector<Row>& rows, const std::string& extra = "");
/// The first line of every CSV.
extern const char* const kCsvHeader;
/// The rows as CSV, header included.
std::string to_csv(const RunInfo& ri, const std::vector<Row>& rows);
/// Writes `data` to `path`; false (errno set) on failure.
bool write_file(const std::string& path, const std::string& data);

}  // namespace strata::bench
