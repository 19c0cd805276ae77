#pragma once
// What the host's CPU caches look like, read once from sysfs: algorithms that hand data
// between cores through the cache need to know whether the cores share one.

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace strata {

/// The host's last-level cache as sysfs describes it for the online CPUs.
struct LastLevelCache {
  size_t bytes = 0;     // of one instance (0: unknown)
  int level = 0;        // 0: unknown
  bool shared = false;  // one instance serves every online CPU
};

/// The host's last-level cache; every process on the host sees the same answer (it does
/// not depend on the caller's CPU affinity), so ranks may base layouts they must agree on
/// on it. {} when sysfs does not say.
const LastLevelCache& last_level_cache();

/// The first line of a file (sysfs and procfs hold one value per line); empty when it cannot
/// be read.
std::string read_first_line(const std::string& path);

/// Parses a Linux CPU list ("0-3,8,10-11") into CPU numbers; empty on malformed text.
std::vector<int> parse_cpu_list(std::string_view text);

/// last_level_cache() from a sysfs tree rooted at `root` ("/sys/devices/system/cpu"), for tests.
LastLevelCache read_last_level_cache(const std::string& root);

}  // namespace strata
