#include "common/cpu_cache.hpp"

#include <algorithm>
#include <fstream>
#include <optional>

#include "common/parse.hpp"

namespace strata {
std::string read_first_line(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s;
}

std::vector<int> parse_cpu_list(std::string_view text) {
  std::vector<int> cpus;
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
  if (text.empty()) return cpus;
  for (;;) {
    const size_t comma = text.find(',');
    const std::string_view item = text.substr(0, comma);
    const size_t dash = item.find('-');
    auto lo = parse_int(item.substr(0, dash), 0, 1 << 20);
    auto hi = dash == std::string_view::npos ? lo : parse_int(item.substr(dash + 1), 0, 1 << 20);
    if (!lo.is_ok() || !hi.is_ok() || hi.value() < lo.value()) return {};
    for (int64_t c = lo.value(); c <= hi.value(); ++c) cpus.push_back(static_cast<int>(c));
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

LastLevelCache read_last_level_cache(const std::string& root) {
  const std::vector<int> online = parse_cpu_list(read_first_line(root + "/online"));
  if (online.empty()) return {};
  LastLevelCache llc;
  bool all_shared = true;
  for (int cpu : online) {
    // The highest-level data or unified cache of this CPU.
    int best_level = 0;
    std::string best;
    for (int i = 0;; ++i) {
      const std::string dir = root + "/cpu" + std::to_string(cpu) + "/cache/index" + std::to_string(i);
      const std::string level = read_first_line(dir + "/level");
      if (level.empty()) break;
      if (read_first_line(dir + "/type") == "Instruction") continue;
      auto l = parse_int(level, 0, 16);
      if (l.is_ok() && l.value() > best_level) best_level = static_cast<int>(l.value()), best = dir;
    }
    if (best_level == 0) return {};
    const std::vector<int> sharing = parse_cpu_list(read_first_line(best + "/shared_cpu_list"));
    all_shared = all_shared && std::includes(sharing.begin(), sharing.end(), online.begin(), online.end());
    if (cpu == online.front()) {
      llc.level = best_level;
      auto size = parse_size(read_first_line(best + "/size"));  // "491520K": binary units
      llc.bytes = size.is_ok() ? size.value() : 0;
    } else if (best_level != llc.level) {
      all_shared = false;
    }
  }
  llc.shared = all_shared;
  return llc;
}

const LastLevelCache& last_level_cache() {
  static const LastLevelCache llc = read_last_level_cache("/sys/devices/system/cpu");
  return llc;
}

}  // namespace strata
