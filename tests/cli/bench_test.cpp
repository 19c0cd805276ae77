// `strata bench`: a short sweep runs through the launcher, checks every size and writes a JSON
// document with the documented fields; malformed command lines are usage errors (exit 2).

#include <unistd.h>

#include <cctype>
#include <map>
#include <memory>
#include <set>
#include <variant>

#include "cli/cli_test_util.hpp"

namespace strata::cli_test {
namespace {

// A small JSON reader, enough to prove the document parses and to read its fields.
struct Json {
  std::variant<std::nullptr_t, bool, double, std::string, std::vector<Json>, std::map<std::string, Json>> v;
  const Json* get(const std::string& k) const {
    auto* m = std::get_if<std::map<std::string, Json>>(&v);
    if (!m) return nullptr;
    auto it = m->find(k);
    return it == m->end() ? nullptr : &it->second;
  }
};

class JsonReader {
 public:
  explicit JsonReader(const std::string& s) : s_(s) {}
  bool parse(Json& out) {
    if (!value(out)) return false;
    ws();
    return i_ == s_.size();
  }

 private:
  void ws() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  bool lit(const char* w) {
    size_t n = std::strlen(w);
    if (s_.compare(i_, n, w) != 0) return false;
    i_ += n;
    return true;
  }
  bool str(std::string& out) {
    if (s_[i_] != '"') return false;
    for (++i_; i_ < s_.size(); ++i_) {
      char c = s_[i_];
      if (c == '"') return ++i_, true;
      if (c == '\\') {
        if (++i_ >= s_.size()) return false;
        if (s_[i_] == 'u') i_ += 4, out += '?';
        else out += s_[i_];
      } else {
        out += c;
      }
    }
    return false;
  }
  bool value(Json& out) {
    ws();
    if (i_ >= s_.size()) return false;
    char c = s_[i_];
    if (c == '{') {
      std::map<std::string, Json> m;
      ++i_;
      ws();
      if (s_[i_] == '}') return ++i_, out.v = m, true;
      for (;;) {
        ws();
        std::string k;
        Json v;
        if (!str(k)) return false;
        ws();
        if (s_[i_++] != ':' || !value(v)) return false;
        m[k] = v;
        ws();
        if (s_[i_] == ',') ++i_;
        else if (s_[i_] == '}') return ++i_, out.v = m, true;
        else return false;
      }
    }
    if (c == '[') {
      std::vector<Json> a;
      ++i_;
      ws();
      if (s_[i_] == ']') return ++i_, out.v = a, true;
      for (;;) {
        Json v;
        if (!value(v)) return false;
        a.push_back(v);
        ws();
        if (s_[i_] == ',') ++i_;
        else if (s_[i_] == ']') return ++i_, out.v = a, true;
        else return false;
      }
    }
    if (c == '"') {
      std::string s;
      if (!str(s)) return false;
      out.v = s;
      return true;
    }
    if (lit("true")) return out.v = true, true;
    if (lit("false")) return out.v = false, true;
    if (lit("null")) return out.v = nullptr, true;
    char* end = nullptr;
    double d = std::strtod(s_.c_str() + i_, &end);
    if (end == s_.c_str() + i_) return false;
    i_ = static_cast<size_t>(end - s_.c_str());
    out.v = d;
    return true;
  }
  const std::string& s_;
  size_t i_ = 0;
};

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(BenchCli, ShortAllReduceSweepChecksEverySizeAndWritesJson) {
  STRATA_REQUIRE_BIN();
  TempDir dir;
  std::string json = dir.path() + "/ar.json";
  Outcome r = run_cli(
      {"bench", "all_reduce", "-n", "2", "-b", "8", "-e", "64K", "-f", "4", "--iters", "5", "--json", json}, {}, 60s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  // 8 B .. 64 KiB by 4: 8 32 128 512 2K 8K 32K.
  const std::vector<size_t> sizes = {8, 32, 128, 512, 2048, 8192, 32768};
  std::vector<std::string> rows;
  for (const auto& l : lines_of(r.out))
    if (!l.empty() && l[0] != '#') rows.push_back(l);
  ASSERT_EQ(rows.size(), sizes.size()) << r.out;
  for (size_t i = 0; i < rows.size(); ++i) {
    std::istringstream in(rows[i]);
    size_t size = 0;
    in >> size;
    EXPECT_EQ(size, sizes[i]) << rows[i];
    EXPECT_TRUE(rows[i].ends_with(" ok")) << "size " << sizes[i] << " not checked ok: " << rows[i];
  }
  EXPECT_TRUE(contains(r.out, "# check: all 7 sizes ok")) << r.out;

  std::string text = read_file(json);
  Json doc;
  ASSERT_TRUE(JsonReader(text).parse(doc)) << "the JSON does not parse:\n" << text;
  for (const char* k : {"system", "label", "collective", "nranks", "dtype", "op", "inplace", "buffers", "busbw_factor",
                        "timing", "results"})
    EXPECT_NE(doc.get(k), nullptr) << "missing field " << k;
  EXPECT_EQ(std::get<std::string>(doc.get("collective")->v), "all_reduce");
  EXPECT_EQ(std::get<double>(doc.get("nranks")->v), 2.0);
  EXPECT_EQ(std::get<double>(doc.get("busbw_factor")->v), 1.0);  // 2(n-1)/n at n = 2
  const auto& results = std::get<std::vector<Json>>(doc.get("results")->v);
  ASSERT_EQ(results.size(), sizes.size());
  for (size_t i = 0; i < results.size(); ++i) {
    const Json& row = results[i];
    for (const char* k : {"size", "count", "iters", "time_us", "time_min_us", "time_max_us", "algbw_gbs", "busbw_gbs",
                          "check", "wrong"})
      ASSERT_NE(row.get(k), nullptr) << "row " << i << " lacks " << k;
    EXPECT_EQ(std::get<double>(row.get("size")->v), static_cast<double>(sizes[i]));
    EXPECT_EQ(std::get<double>(row.get("count")->v), static_cast<double>(sizes[i] / 4));
    EXPECT_EQ(std::get<double>(row.get("iters")->v), 5.0);
    EXPECT_EQ(std::get<std::string>(row.get("check")->v), "ok");
    double t = std::get<double>(row.get("time_us")->v);
    double algbw = std::get<double>(row.get("algbw_gbs")->v);
    EXPECT_GT(t, 0);
    EXPECT_NEAR(algbw, static_cast<double>(sizes[i]) / t / 1e3, algbw * 1e-3 + 1e-6) << "algbw = size / time";
  }
}

// A stand-in for matplotlib (the plot script's calls only), found through PYTHONPATH: the
// test needs no matplotlib, and a "plot" is the JSON the script read, copied to the PNG path.
// FAIL_PLOT in the environment makes savefig fail (the error path).
void write_fake_matplotlib(const std::string& dir) {
  std::filesystem::create_directories(dir + "/matplotlib");
  std::ofstream(dir + "/matplotlib/__init__.py") << "def use(*a, **k):\n    pass\n";
  std::ofstream(dir + "/matplotlib/pyplot.py") << "import os, sys\n"
                                                  "class _Any:\n"
                                                  "    def __getattr__(self, n):\n"
                                                  "        return lambda *a, **k: None\n"
                                                  "class _Fig(_Any):\n"
                                                  "    def savefig(self, path, **k):\n"
                                                  "        if os.environ.get('FAIL_PLOT'):\n"
                                                  "            raise OSError('plot refused')\n"
                                                  "        open(path, 'w').write(open(sys.argv[1]).read())\n"
                                                  "def subplots(*a, **k):\n"
                                                  "    return _Fig(), (_Any(), _Any())\n";
}

std::set<std::string> entries(const std::string& dir) {
  std::set<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) out.insert(e.path().filename().string());
  return out;
}

std::vector<std::string> new_bench_files(const std::set<std::string>& before) {
  std::vector<std::string> out;
  for (const auto& e : entries("/tmp"))
    if (!before.count(e) && e.starts_with("strata-bench-")) out.push_back("/tmp/" + e);
  return out;
}

// --plot without --json writes the results to a temporary file: nothing of it may be left in
// $TMPDIR (or /tmp), whether the plot works, fails, or `strata bench` is SIGKILLed mid-run.
TEST(BenchCli, CsvQuotesALabelWithCommasAndQuotes) {
  STRATA_REQUIRE_BIN();
  TempDir dir;
  const std::string csv = dir.path() + "/q.csv";
  Outcome r = run_cli({"bench", "all_reduce", "-n", "2", "-b", "8", "-e", "8", "--iters", "2", "--repeats", "1",
                       "--csv", csv, "--label", "a,\"b"},
                      {}, 60s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto rows = lines_of(read_file(csv));
  ASSERT_GE(rows.size(), 2u) << read_file(csv);
  EXPECT_TRUE(rows[1].starts_with("strata,\"a,\"\"b\",all_reduce,2,")) << rows[1];
}

TEST(BenchCli, PlotLeavesNoTemporaryFileBehind) {
  STRATA_REQUIRE_BIN();
  TempDir tmp, work;
  write_fake_matplotlib(work.path() + "/py");
  const auto tmp_before = entries("/tmp");
  const std::vector<std::string> env = {"TMPDIR=" + tmp.path(), "PYTHONPATH=" + work.path() + "/py"};
  const std::string png = work.path() + "/plot.png";
  const std::vector<std::string> args = {"bench", "all_reduce", "-n",      "2", "-b",     "8",
                                         "-e",    "1K",         "--iters", "3", "--plot", png};

  Outcome ok = run_cli(args, env, 60s);
  EXPECT_EQ(ok.exit_code, 0) << ok.out << ok.err;
  EXPECT_TRUE(contains(ok.out, "# plot: " + png)) << ok.out;
  EXPECT_TRUE(contains(read_file(png), "\"results\"")) << "the plotter did not get the JSON";
  EXPECT_TRUE(entries(tmp.path()).empty()) << "a successful run left a file in TMPDIR";

  std::vector<std::string> fail_env = env;
  fail_env.push_back("FAIL_PLOT=1");
  Outcome failed = run_cli(args, fail_env, 60s);
  EXPECT_EQ(failed.exit_code, 1) << failed.out << failed.err;
  EXPECT_TRUE(contains(failed.err, "the plot failed")) << failed.err;
  EXPECT_TRUE(entries(tmp.path()).empty()) << "a failed plot left a file in TMPDIR";

  // SIGKILL in the middle of a long sweep: no code of ours runs afterwards.
  std::vector<std::string> long_args = args;
  // 64 MiB, not more: the ranks allocate and touch the largest size before the table starts,
  // which under TSan's shadow memory takes tens of seconds at 1 GiB.
  long_args[7] = "64M";
  long_args[9] = "1000";
  CliProcess p(long_args, env);
  auto deadline = Clock::now() + 60s;
  while (!contains(p.out(), "size(B)") && Clock::now() < deadline) p.pump(20ms);
  ASSERT_TRUE(contains(p.out(), "size(B)")) << "the sweep did not start: " << p.out();
  p.pump(300ms);
  ASSERT_EQ(::kill(p.pid(), SIGKILL), 0);
  p.finish(10s);
  std::this_thread::sleep_for(500ms);
  EXPECT_TRUE(entries(tmp.path()).empty()) << "a SIGKILLed run left a file in TMPDIR";
  for (const auto& f : new_bench_files(tmp_before)) ADD_FAILURE() << "left behind: " << f;
}

TEST(BenchCli, AllGatherSizeIsTheTotalBuffer) {
  STRATA_REQUIRE_BIN();
  // nccl-tests: for all_gather the size is ranks x per-rank block; 1 KiB fp32 on 2 ranks =
  // 256 elements in all, 128 per rank.
  Outcome r =
      run_cli({"bench", "all_gather", "-n", "2", "-b", "1K", "-e", "1K", "--iters", "3", "--repeats", "3"}, {}, 60s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  bool seen = false;
  for (const auto& l : lines_of(r.out)) {
    if (l.empty() || l[0] == '#') continue;
    std::istringstream in(l);
    size_t size = 0, count = 0;
    in >> size >> count;
    EXPECT_EQ(size, 1024u) << l;
    EXPECT_EQ(count, 256u) << l;
    EXPECT_TRUE(l.ends_with(" ok")) << l;
    seen = true;
  }
  EXPECT_TRUE(seen) << r.out;
}

// STRATA_PUSH is a per-process setting, but pushing changes how many synchronisations a call
// makes: one rank set to pull makes every rank pull (the choice rides in the descriptors),
// rather than ranks counting different steps and mismatching or waiting for the timeout.
TEST(BenchCli, OneRankThatPullsMakesEveryRankPull) {
  STRATA_REQUIRE_BIN();
  for (const char* coll : {"all_reduce", "all_gather"}) {
    const std::string rank_cmd = "if [ \"$STRATA_RANK\" = 1 ]; then export STRATA_PUSH=pull; fi; exec '" +
                                 strata_bin() + "' bench " + coll +
                                 " --as-rank -b 1M -e 4M -f 4 --iters 3 --repeats 2 --warmup 1";
    Outcome r =
        run_cli({"run", "-n", "3", "--timeout", "60s", "--", "sh", "-c", rank_cmd}, {"STRATA_TIMEOUT=20s"}, 90s);
    ASSERT_EQ(r.exit_code, 0) << coll << "\n" << r.out << r.err;
    EXPECT_TRUE(contains(r.out, "check: all 2 sizes ok")) << coll << "\n" << r.out;
  }
}

// `strata bench moe`: the decode cases (3 token counts x 3 methods) each print a row and append
// one JSON object per line with the figures the report reads; bad command lines are usage errors
// found before any rank starts.
TEST(BenchCli, MoeDecodeSweepAppendsOneJsonLinePerCase) {
  STRATA_REQUIRE_BIN();
  TempDir dir;
  const std::string json = dir.path() + "/moe.jsonl";
  Outcome r = run_cli({"bench", "moe", "-n", "2", "--quick", "--only", "decode", "--json", json}, {}, 120s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  std::vector<std::string> rows;
  for (const auto& l : lines_of(r.out))
    if (l.starts_with("  decode")) rows.push_back(l);
  EXPECT_EQ(rows.size(), 9u) << r.out;
  const auto objects = lines_of(read_file(json));
  size_t parsed = 0;
  std::set<std::string> methods;
  for (const auto& text : objects) {
    if (text.empty()) continue;
    Json doc;
    ASSERT_TRUE(JsonReader(text).parse(doc)) << "a JSON line does not parse: " << text;
    ++parsed;
    for (const char* k : {"phase", "ranks", "tokens", "hidden", "method", "dispatch_us", "combine_us", "memcpy_us"})
      ASSERT_NE(doc.get(k), nullptr) << "missing field " << k << " in " << text;
    EXPECT_EQ(std::get<std::string>(doc.get("phase")->v), "decode");
    EXPECT_EQ(std::get<double>(doc.get("ranks")->v), 2.0);
    EXPECT_GT(std::get<double>(doc.get("dispatch_us")->v), 0.0) << text;
    methods.insert(std::get<std::string>(doc.get("method")->v));
  }
  EXPECT_EQ(parsed, 9u) << read_file(json);
  EXPECT_EQ(methods, (std::set<std::string>{"strata-decode", "strata-prefill", "strata-relay"}));

  Outcome only = run_cli({"bench", "moe", "-n", "2", "--only", "train"});
  EXPECT_EQ(only.exit_code, 2) << only.err;
  EXPECT_TRUE(contains(only.err, "--only takes prefill or decode, got 'train'")) << only.err;
  Outcome non = run_cli({"bench", "moe", "--quick"});
  EXPECT_EQ(non.exit_code, 2) << non.err;
  EXPECT_TRUE(contains(non.err, "-n is required")) << non.err;
  Outcome proc = run_cli({"bench", "moe", "-n", "2", "--json", "/proc/strata-moe.jsonl"});
  EXPECT_EQ(proc.exit_code, 2) << proc.out << proc.err;
  EXPECT_TRUE(contains(proc.err, "--json /proc/strata-moe.jsonl: cannot write in /proc")) << proc.err;
  EXPECT_FALSE(contains(proc.out, "decode")) << "the sweep ran: " << proc.out;
}

TEST(BenchCli, BadCommandLinesAreUsageErrors) {
  STRATA_REQUIRE_BIN();
  Outcome bad = run_cli({"bench", "all_reduse", "-n", "2"});
  EXPECT_EQ(bad.exit_code, 2) << bad.out << bad.err;
  EXPECT_TRUE(contains(bad.err, "unknown collective 'all_reduse'")) << bad.err;
  EXPECT_EQ(run_cli({"bench", "all_reduce"}).exit_code, 2);                         // no -n
  EXPECT_EQ(run_cli({"bench", "all_reduce", "-n", "2", "-b", "8X"}).exit_code, 2);  // bad size
  EXPECT_EQ(run_cli({"bench", "all_reduce", "-n", "2", "--buffers", "gpu"}).exit_code, 2);
  // From 0 the sizes would never grow (it looped forever).
  Outcome zero = run_cli({"bench", "all_reduce", "-n", "2", "-b", "0", "-e", "64"});
  EXPECT_EQ(zero.exit_code, 2) << zero.out << zero.err;
  EXPECT_TRUE(contains(zero.err, "-b must be at least 1 byte")) << zero.err;
  // An output file that cannot be written is found before the sweep, not after it.
  Outcome nodir = run_cli({"bench", "all_reduce", "-n", "2", "--json", "/nonexistent-dir/r.json"});
  EXPECT_EQ(nodir.exit_code, 2) << nodir.out << nodir.err;
  EXPECT_TRUE(contains(nodir.err, "--json /nonexistent-dir/r.json: cannot write in /nonexistent-dir")) << nodir.err;
  EXPECT_FALSE(contains(nodir.out, "all_reduce")) << "the sweep ran: " << nodir.out;
  Outcome isdir = run_cli({"bench", "all_reduce", "-n", "2", "--csv", "/tmp"});
  EXPECT_EQ(isdir.exit_code, 2) << isdir.err;
  EXPECT_TRUE(contains(isdir.err, "--csv /tmp: is a directory")) << isdir.err;
  // A directory that access() calls writable for root but where no file can be made (/proc);
  // the probe opens the file for real.
  Outcome proc = run_cli({"bench", "all_reduce", "-n", "2", "--plot", "/proc/strata-bench.png"});
  EXPECT_EQ(proc.exit_code, 2) << proc.out << proc.err;
  EXPECT_TRUE(contains(proc.err, "--plot /proc/strata-bench.png: cannot write in /proc")) << proc.err;
  EXPECT_FALSE(contains(proc.out, "all_reduce")) << "the sweep ran: " << proc.out;
  // The probe leaves no file behind when the run stops before writing one (--csv is probed
  // before --plot).
  const std::string probe = "/tmp/strata-bench-probe-" + std::to_string(::getpid()) + ".csv";
  Outcome later = run_cli({"bench", "all_reduce", "-n", "2", "--csv", probe, "--plot", "/proc/p.png"});
  EXPECT_EQ(later.exit_code, 2) << later.err;
  EXPECT_TRUE(contains(later.err, "--plot /proc/p.png")) << later.err;
  EXPECT_NE(::access(probe.c_str(), F_OK), 0) << probe << " was left behind";
  // Options the collective would ignore.
  Outcome algo = run_cli({"bench", "all_gather", "-n", "2", "--algorithm", "one_shot"});
  EXPECT_EQ(algo.exit_code, 2) << algo.err;
  EXPECT_TRUE(contains(algo.err, "--algorithm is for all_reduce")) << algo.err;
  Outcome root = run_cli({"bench", "all_reduce", "-n", "2", "--root", "1"});
  EXPECT_EQ(root.exit_code, 2) << root.err;
  EXPECT_TRUE(contains(root.err, "--root: all_reduce has no root")) << root.err;
  Outcome help = run_cli({"bench", "--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_TRUE(contains(help.out, "usage: strata bench")) << help.out;
}

}  // namespace
}  // namespace strata::cli_test
