// Collecting and merging the ranks' flight-recorder dumps (cli/flight_report.hpp). The line
// format is written by coll/flight.cpp (flight_dump_lines):
//   strata-flight: begin rank=G pid=P
//   strata-flight: comm rank=G id=ID crank=R size=N members=G0,G1,... entries=K
//   strata-flight: op rank=G id=ID seq=S kind=K dtype=D count=C root=R state=ST queued_ms=A started_ms=B done_ms=C
//   strata-flight: end rank=G
// Ages are milliseconds before the dump (-1: not yet).

#include "cli/flight_report.hpp"

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace strata::cli::launch {

namespace {

using Fields = std::map<std::string, std::string>;

/// The words after the marker: the record's type and its key=value fields.
bool split(const std::string& line, std::string& type, Fields& f) {
  const std::string m = kFlightLineMarker;
  if (line.compare(0, m.size(), m) != 0) return false;
  std::istringstream is(line.substr(m.size()));
  if (!(is >> type)) return false;
  std::string w;
  while (is >> w) {
    const size_t eq = w.find('=');
    if (eq != std::string::npos) f[w.substr(0, eq)] = w.substr(eq + 1);
  }
  return true;
}

long long num(const Fields& f, const char* k, long long dflt = -1) {
  auto it = f.find(k);
  if (it == f.end() || it->second.empty()) return dflt;
  char* end = nullptr;
  long long v = std::strtoll(it->second.c_str(), &end, 10);
  return *end ? dflt : v;
}

std::string str(const Fields& f, const char* k) {
  auto it = f.find(k);
  return it == f.end() ? std::string() : it->second;
}

bool is_p2p(const std::string& kind) { return kind == "send" || kind == "recv"; }

std::string ago(long long ms) {
  if (ms < 0) return "?";
  if (ms < 1000) return std::to_string(ms) + " ms ago";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s ago", static_cast<double>(ms) / 1000.0);
  return buf;
}

}  // namespace

bool FlightReport::take(const std::string& line) {
  std::string type;
  Fields f;
  if (!split(line, type, f)) return false;
  const long long g = num(f, "rank");
  if (g < 0) return true;  // malformed, but ours: not relayed
  Dump& d = dumps_[static_cast<int>(g)];
  if (type == "begin") {
    d = Dump{};
  } else if (type == "end") {
    d.ended = true;
  } else if (type == "comm") {
    Comm c;
    c.id = str(f, "id");
    c.crank = static_cast<int>(num(f, "crank", 0));
    c.size = static_cast<int>(num(f, "size", 0));
    std::istringstream ms(str(f, "members"));
    std::string tok;
    while (std::getline(ms, tok, ','))
      if (!tok.empty()) c.members.push_back(std::atoi(tok.c_str()));
    d.comms.push_back(std::move(c));
  } else if (type == "op") {
    const std::string id = str(f, "id");
    for (auto it = d.comms.rbegin(); it != d.comms.rend(); ++it) {
      if (it->id != id) continue;
      Op o;
      o.seq = static_cast<uint32_t>(num(f, "seq", 0));
      o.kind = str(f, "kind");
      o.dtype = str(f, "dtype");
      o.state = str(f, "state");
      o.count = static_cast<uint64_t>(num(f, "count", 0));
      o.root = static_cast<int>(num(f, "root", -1));
      o.queued_ms = num(f, "queued_ms");
      o.started_ms = num(f, "started_ms");
      o.done_ms = num(f, "done_ms");
      it->ops.push_back(std::move(o));
      break;
    }
  }
  return true;
}

bool FlightReport::complete() const {
  for (int r : expected_) {
    auto it = dumps_.find(r);
    if (it == dumps_.end() || !it->second.ended) return false;
  }
  return true;
}

long long FlightReport::progress(int g, const std::string& id) const {
  auto it = dumps_.find(g);
  if (it == dumps_.end() || !it->second.ended) return -2;
  long long best = -1;
  for (const Comm& c : it->second.comms) {
    if (c.id != id) continue;
    for (const Op& o : c.ops)
      if (!is_p2p(o.kind) && o.state != "queued" && static_cast<long long>(o.seq) > best) best = o.seq;
  }
  return best;
}

namespace {

std::string describe(const std::string& kind, const std::string& dtype, uint64_t count, int root, uint32_t seq,
                     const std::vector<int>& members) {
  auto global = [&](int r) { return r >= 0 && r < static_cast<int>(members.size()) ? members[r] : r; };
  std::string s = (seq ? "#" + std::to_string(seq) + " " : std::string()) + kind;
  if (kind == "barrier") return s;
  s += " " + dtype + " x" + std::to_string(count);
  if (kind == "send") s += " to rank " + std::to_string(global(root));
  else if (kind == "recv") s += " from rank " + std::to_string(global(root));
  else if (root >= 0) s += " root " + std::to_string(global(root));
  return s;
}

}  // namespace

std::string FlightReport::line_of(int g, const Comm& c) const {
  const Op* last = nullptr;
  std::vector<const Op*> pending;
  int queued = 0;
  for (const Op& o : c.ops) {
    if (o.state == "done" || o.state == "failed") last = &o;
    else if (o.state == "started") pending.push_back(&o);
    else if (o.state == "queued") ++queued;
  }
  std::string s = "rank " + std::to_string(g) + " [" + c.id + "]: last completed ";
  if (last) {
    s += describe(last->kind, last->dtype, last->count, last->root, last->seq, c.members);
    if (last->state == "failed") s += " (failed)";
    s += " " + ago(last->done_ms);
  } else {
    s += "none";
  }
  if (pending.empty()) {
    s += "; nothing pending";
  }
  for (const Op* p : pending) {
    s += "; pending " + describe(p->kind, p->dtype, p->count, p->root, p->seq, c.members) + " started " +
         ago(p->started_ms);
    std::vector<std::string> waits;
    if (is_p2p(p->kind)) {
      const int peer = p->root >= 0 && p->root < static_cast<int>(c.members.size()) ? c.members[p->root] : p->root;
      waits.push_back("rank " + std::to_string(peer));
    } else {
      for (int m : c.members) {
        if (m == g) continue;
        const long long at = progress(m, c.id);
        if (at == -2) waits.push_back("rank " + std::to_string(m) + " (no answer)");
        else if (at < static_cast<long long>(p->seq))
          waits.push_back("rank " + std::to_string(m) + " (at " + (at > 0 ? "#" + std::to_string(at) : "none") + ")");
      }
    }
    if (waits.empty()) {
      s += ", every member has reached it";
    } else {
      s += ", waiting for ";
      for (size_t i = 0; i < waits.size(); ++i) s += (i ? ", " : "") + waits[i];
    }
  }
  if (queued) s += "; " + std::to_string(queued) + " more queued";
  return s;
}

std::vector<std::string> FlightReport::render(const std::vector<int>& ranks) const {
  std::vector<std::string> out;
  for (int g : ranks) {
    auto it = dumps_.find(g);
    if (it == dumps_.end() || !it->second.ended) {
      out.push_back("rank " + std::to_string(g) + ": no answer" +
                    (expected_.count(g) ? std::string(" (busy in a system call for long, or exiting)")
                                        : std::string(" (not asked: no SIGUSR1 handler yet, or not running)")));
      continue;
    }
    bool any = false;
    for (const Comm& c : it->second.comms) {
      if (c.ops.empty()) continue;
      out.push_back(line_of(g, c));
      any = true;
    }
    if (!any) out.push_back("rank " + std::to_string(g) + ": no operation recorded");
  }
  return out;
}

bool catches_signal(pid_t pid, int sig) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.compare(0, 7, "SigCgt:") != 0) continue;
    const unsigned long long mask = std::strtoull(line.c_str() + 7, nullptr, 16);
    return (mask >> (sig - 1)) & 1ull;
  }
  return false;
}

}  // namespace strata::cli::launch
