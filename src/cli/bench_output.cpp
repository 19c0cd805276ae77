#include "cli/bench_output.hpp"

#include <cmath>
#include <cstdio>

namespace strata::bench {

Row make_row(const RunInfo& ri, const SizePoint& sp, const Timing& t, bool checked, size_t wrong) {
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

std::string table_header(const RunInfo& ri) {
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

std::string table_row(const RunInfo& ri, const Row& r) {
  const CollInfo& ci = info(ri.opts.coll);
  char buf[512];
  std::string root = ci.rooted ? std::to_string(ri.opts.root) : "-";
  std::snprintf(buf, sizeof buf, "  %12zu %12zu %9s %6s %5s %7d %11.2f %11.2f %11.3f %11.3f %6s\n", r.bytes, r.count,
                info(ri.opts.dtype).name, ci.reduces ? op_name(ri.opts.op) : "-", root.c_str(), r.iters, r.time_us,
                r.time_min_us, r.algbw, r.busbw,
                !r.checked ? "-"
                : r.wrong  ? "FAIL"
                           : "ok");
  return buf;
}

std::string json_escape(const std::string& s) {
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

std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char b[64];
  std::snprintf(b, sizeof b, "%.6g", v);
  return b;
}

std::string to_json(const RunInfo& ri, const std::vector<Row>& rows, const std::string& extra) {
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
         ", \"algbw_gbs\": " + json_number(r.algbw) + ", \"busbw_gbs\": " + json_number(r.busbw) + ", \"check\": \"" +
         (!r.checked ? "skipped"
          : r.wrong  ? "FAIL"
                     : "ok") +
         "\", \"wrong\": " + std::to_string(r.wrong) + "}";
  }
  j += "\n  ]\n}\n";
  return j;
}

const char* const kCsvHeader =
    "system,label,collective,nranks,dtype,op,inplace,buffers,size,count,iters,time_us,time_min_us,time_max_us,"
    "algbw_gbs,busbw_gbs,check\n";

namespace {
/// A CSV field as RFC 4180 has it: quoted, its quotes doubled, when it holds a comma, a quote
/// or a line break (a --label may).
std::string csv_field(const std::string& v) {
  if (v.find_first_of(",\"\r\n") == std::string::npos) return v;
  std::string q = "\"";
  for (char ch : v) {
    if (ch == '"') q += '"';
    q += ch;
  }
  return q + '"';
}
}  // namespace

std::string to_csv(const RunInfo& ri, const std::vector<Row>& rows) {
  const Options& o = ri.opts;
  const CollInfo& ci = info(o.coll);
  std::string s = kCsvHeader;
  const std::string label = csv_field(ri.label);
  for (const Row& r : rows) {
    char buf[512];
    s += csv_field(ri.system) + ',' + label + ',';
    std::snprintf(buf, sizeof buf, "%s,%d,%s,%s,%d,%s,%zu,%zu,%d,%.4f,%.4f,%.4f,%.5f,%.5f,%s\n", ci.name, ri.nranks,
                  info(o.dtype).name, ci.reduces ? op_name(o.op) : "none", o.inplace ? 1 : 0,
                  ri.system == "strata" ? buffers_name(o.buffers) : "malloc", r.bytes, r.count, r.iters, r.time_us,
                  r.time_min_us, r.time_max_us, r.algbw, r.busbw,
                  !r.checked ? "skipped"
                  : r.wrong  ? "FAIL"
                             : "ok");
    s += buf;
  }
  return s;
}

bool write_file(const std::string& path, const std::string& data) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return false;
  bool ok = std::fwrite(data.data(), 1, data.size(), f) == data.size();
  ok = (std::fclose(f) == 0) && ok;
  return ok;
}

}  // namespace strata::bench
