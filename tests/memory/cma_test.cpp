// CMA (process_vm_readv/writev) against a forked child.

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <vector>

#include "memory/heap.hpp"
#include "memory/test_util.hpp"
#include "test_status.hpp"

namespace strata::memory {
namespace {

using testing::pattern;
using testing::read_all;
using testing::reap;
using testing::spawn;
using testing::write_all;

constexpr size_t kBytes = 8u << 20;  // several pages, so partial transfers could show

TEST(Cma, ReadWriteAndPeerFailedOnceTheChildIsGone) {
  // The buffer exists before the fork, so it has the same address in the child.
  std::vector<unsigned char> buf(kBytes, 0);
  int to_child[2], to_parent[2];
  ASSERT_EQ(pipe(to_child), 0);
  ASSERT_EQ(pipe(to_parent), 0);
  const pid_t child = spawn([&]() -> int {
    for (size_t i = 0; i < kBytes; ++i) buf[i] = pattern(1, i);
    char c = 1;
    if (!write_all(to_parent[1], &c, 1)) return 2;
    if (!read_all(to_child[0], &c, 1)) return 3;
    for (size_t i = 0; i < kBytes; ++i)
      if (buf[i] != pattern(2, i)) return 4;
    return 0;
  });
  ASSERT_GT(child, 0);
  close(to_child[0]);
  close(to_parent[1]);
  char c = 0;
  ASSERT_TRUE(read_all(to_parent[0], &c, 1));

  if (!cma_probe(child, buf.data(), kBytes)) {
    kill(child, SIGKILL);
    reap(child);
    GTEST_SKIP() << "process_vm_readv is not permitted here (ptrace restrictions)";
  }
  EXPECT_FALSE(cma_probe(child, nullptr, 16)) << "an unmapped address must fail the probe";
  std::vector<unsigned char> got(kBytes, 0);
  STRATA_ASSERT_OK(cma_read(child, buf.data(), got.data(), kBytes));
  for (size_t i = 0; i < kBytes; ++i) ASSERT_EQ(got[i], pattern(1, i)) << "byte " << i << " read from the child";
  EXPECT_EQ(buf[0], 0) << "the parent's copy is untouched";

  Status bad = cma_read(child, nullptr, got.data(), 16);
  EXPECT_EQ(bad.code(), Code::InvalidArgument) << bad.to_string();

  for (size_t i = 0; i < kBytes; ++i) got[i] = pattern(2, i);
  STRATA_ASSERT_OK(cma_write(child, buf.data(), got.data(), kBytes));
  ASSERT_TRUE(write_all(to_child[1], &c, 1));
  EXPECT_EQ(reap(child), 0) << "the child did not see the parent's write (exit code 4)";

  Status gone = cma_read(child, buf.data(), got.data(), 64);
  EXPECT_EQ(gone.code(), Code::PeerFailed) << gone.to_string();
  EXPECT_NE(gone.message().find(std::to_string(child)), std::string::npos) << gone.message();
  EXPECT_EQ(cma_write(child, buf.data(), got.data(), 64).code(), Code::PeerFailed);
  EXPECT_FALSE(cma_probe(child, buf.data(), 64));
  close(to_child[1]);
  close(to_parent[0]);
}

}  // namespace
}  // namespace strata::memory
