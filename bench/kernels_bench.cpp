// Micro-benchmarks of the reduction and copy kernels (Google Benchmark).
//
//   reduce_sum/<isa>/<dtype>/<size>: dst = src0 + src1, three buffers of <size> bytes;
//                                    bytes counted = 2 read + 1 written.
//   copy/<how>/<size>:               memcpy, kernels::copy, and a non-temporal-store copy kept
//                                    here as the yardstick for kernels::copy's choice;
//                                    bytes counted = 1 read + 1 written.
// GB/s (decimal) is the "GB/s" counter; bytes_per_second is Google Benchmark's own (binary).
// Buffers are touched before timing (first touches cost ~10 us per page on this machine kind).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/reduce.hpp"
#include "common/reduce_isa.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace {

using strata::DataType;
using strata::ReduceOp;
namespace kernels = strata::kernels;

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<unsigned char, FreeDeleter>;

// A page-aligned buffer whose pages are already touched, filled with small values (so sums
// and conversions stay ordinary numbers).
Buffer make_buffer(size_t bytes, unsigned char fill) {
  const size_t rounded = (bytes + 4095) / 4096 * 4096;
  Buffer b(static_cast<unsigned char*>(std::aligned_alloc(4096, rounded)));
  std::memset(b.get(), fill, rounded);
  return b;
}

void set_rate(benchmark::State& state, size_t bytes_per_iteration) {
  const auto total = static_cast<int64_t>(bytes_per_iteration) * state.iterations();
  state.SetBytesProcessed(total);
  state.counters["GB/s"] = benchmark::Counter(static_cast<double>(total), benchmark::Counter::kIsRate);
}

void bm_reduce(benchmark::State& state, kernels::Isa isa, DataType dtype, size_t bytes) {
  Buffer a = make_buffer(bytes, 0x3c), b = make_buffer(bytes, 0x3b), dst = make_buffer(bytes, 0);
  const void* srcs[] = {a.get(), b.get()};
  const size_t count = bytes / strata::dtype_size(dtype);
  for (auto _ : state) {
    kernels::reduce(isa, dtype, ReduceOp::Sum, dst.get(), srcs, 2, count, 2);
    benchmark::DoNotOptimize(dst.get());
    benchmark::ClobberMemory();
  }
  set_rate(state, 3 * bytes);
}

#if defined(__x86_64__)
// Copy with non-temporal (cache-bypassing) stores: align the destination to 64 bytes, stream
// whole 256-byte blocks, finish with memcpy and a store fence.
__attribute__((target("avx2"))) void copy_streaming_avx2(void* dst, const void* src, size_t bytes) {
  auto* d = static_cast<unsigned char*>(dst);
  auto* s = static_cast<const unsigned char*>(src);
  const size_t head = std::min(bytes, (64 - reinterpret_cast<uintptr_t>(d) % 64) % 64);
  std::memcpy(d, s, head);
  d += head, s += head, bytes -= head;
  for (; bytes >= 256; d += 256, s += 256, bytes -= 256) {
    for (int k = 0; k < 8; ++k) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s) + k);
      _mm256_stream_si256(reinterpret_cast<__m256i*>(d) + k, v);
    }
  }
  _mm_sfence();
  std::memcpy(d, s, bytes);
}
#endif

void bm_copy(benchmark::State& state, int how, size_t bytes) {
  Buffer src = make_buffer(bytes, 0x11), dst = make_buffer(bytes, 0);
  for (auto _ : state) {
    switch (how) {
      case 0: std::memcpy(dst.get(), src.get(), bytes); break;
      case 1: kernels::copy(dst.get(), src.get(), bytes); break;
#if defined(__x86_64__)
      case 2: copy_streaming_avx2(dst.get(), src.get(), bytes); break;
#endif
      default: break;
    }
    benchmark::DoNotOptimize(dst.get());
    benchmark::ClobberMemory();
  }
  set_rate(state, 2 * bytes);
}

std::string size_name(size_t bytes) {
  if (bytes >= (size_t{1} << 20)) return std::to_string(bytes >> 20) + "MiB";
  return std::to_string(bytes >> 10) + "KiB";
}

}  // namespace

int main(int argc, char** argv) {
  const size_t reduce_sizes[] = {size_t{4} << 10, size_t{256} << 10, size_t{16} << 20};
  const DataType dtypes[] = {DataType::Float32, DataType::BFloat16, DataType::Float16, DataType::Int32};
  for (size_t bytes : reduce_sizes) {
    for (DataType dtype : dtypes) {
      for (kernels::Isa isa : kernels::kAllIsas) {
        if (!kernels::supported(isa)) continue;
        const std::string name = std::string("reduce_sum/") + kernels::to_string(isa) + "/" + strata::to_string(dtype) +
                                 "/" + size_name(bytes);
        benchmark::RegisterBenchmark(name.c_str(), bm_reduce, isa, dtype, bytes);
      }
    }
  }
  const size_t copy_sizes[] = {size_t{4} << 10,  size_t{256} << 10, size_t{1} << 20,  size_t{4} << 20,  size_t{8} << 20,
                               size_t{12} << 20, size_t{16} << 20,  size_t{64} << 20, size_t{256} << 20};
  const char* copy_names[] = {"memcpy", "kernels", "streaming"};
  for (size_t bytes : copy_sizes) {
    for (int how = 0; how < 3; ++how) {
#if !defined(__x86_64__)
      if (how == 2) continue;
#else
      if (how == 2 && !kernels::supported(kernels::Isa::Avx2)) continue;
#endif
      const std::string name = std::string("copy/") + copy_names[how] + "/" + size_name(bytes);
      benchmark::RegisterBenchmark(name.c_str(), bm_copy, how, bytes);
    }
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("kernels.active", kernels::isa());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
