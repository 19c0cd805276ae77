// The host's last-level cache read from sysfs: fake trees for the shapes that matter (one
// cache for every CPU, one per CPU, missing files) and the real one of this machine.

#include "common/cpu_cache.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace strata {
namespace {

namespace fs = std::filesystem;

class FakeSysfs {
 public:
  FakeSysfs() : root_(fs::temp_directory_path() / ("strata-cpu-cache-" + std::to_string(::getpid()))) {
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  ~FakeSysfs() { fs::remove_all(root_); }
  void put(const std::string& rel, const std::string& text) {
    fs::create_directories((root_ / rel).parent_path());
    std::ofstream(root_ / rel) << text << "\n";
  }
  // CPU `cpu`'s cache index `i`.
  void cache(int cpu, int i, int level, const std::string& type, const std::string& size, const std::string& shared) {
    const std::string dir = "cpu" + std::to_string(cpu) + "/cache/index" + std::to_string(i) + "/";
    put(dir + "level", std::to_string(level));
    put(dir + "type", type);
    put(dir + "size", size);
    put(dir + "shared_cpu_list", shared);
  }
  std::string root() const { return root_.string(); }

 private:
  fs::path root_;
};

TEST(CpuCache, ParsesCpuLists) {
  EXPECT_EQ(parse_cpu_list("0-3,8,10-11\n"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(parse_cpu_list("5"), (std::vector<int>{5}));
  EXPECT_EQ(parse_cpu_list("1,0,1"), (std::vector<int>{0, 1}));
  EXPECT_TRUE(parse_cpu_list("").empty());
  EXPECT_TRUE(parse_cpu_list("3-1").empty());
  EXPECT_TRUE(parse_cpu_list("0-x").empty());
  EXPECT_TRUE(parse_cpu_list("0,,1").empty());
}

TEST(CpuCache, OneL3ForEveryCpuIsShared) {
  FakeSysfs s;
  s.put("online", "0-1");
  for (int cpu = 0; cpu < 2; ++cpu) {
    s.cache(cpu, 0, 1, "Data", "48K", std::to_string(cpu));
    s.cache(cpu, 1, 1, "Instruction", "64K", std::to_string(cpu));
    s.cache(cpu, 2, 2, "Unified", "2048K", std::to_string(cpu));
    s.cache(cpu, 3, 3, "Unified", "491520K", "0-1");
  }
  const LastLevelCache llc = read_last_level_cache(s.root());
  EXPECT_TRUE(llc.shared);
  EXPECT_EQ(llc.level, 3);
  EXPECT_EQ(llc.bytes, size_t{491520} << 10);
}

TEST(CpuCache, AnL3PerCpuOrPerGroupIsNotShared) {
  FakeSysfs s;
  s.put("online", "0-3");
  for (int cpu = 0; cpu < 4; ++cpu) {
    s.cache(cpu, 0, 2, "Unified", "512K", std::to_string(cpu));
    s.cache(cpu, 1, 3, "Unified", "32768K", cpu < 2 ? "0-1" : "2-3");  // two CCXs
  }
  const LastLevelCache llc = read_last_level_cache(s.root());
  EXPECT_FALSE(llc.shared);
  EXPECT_EQ(llc.bytes, size_t{32} << 20);
}

TEST(CpuCache, MissingFilesMeanUnknownNotShared) {
  FakeSysfs s;
  EXPECT_FALSE(read_last_level_cache(s.root()).shared);  // no "online"
  s.put("online", "0-1");
  s.cache(0, 0, 3, "Unified", "8M", "0-1");  // cpu1 has no cache directory
  const LastLevelCache llc = read_last_level_cache(s.root());
  EXPECT_FALSE(llc.shared);
  EXPECT_EQ(llc.level, 0);
}

TEST(CpuCache, ThisHostAnswersTheSameEveryTime) {
  const LastLevelCache& a = last_level_cache();
  const LastLevelCache b = read_last_level_cache("/sys/devices/system/cpu");
  EXPECT_EQ(a.shared, b.shared);
  EXPECT_EQ(a.bytes, b.bytes);
  EXPECT_EQ(a.level, b.level);
}

}  // namespace
}  // namespace strata
