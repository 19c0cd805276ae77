#pragma once
// Element-wise reduction kernels used by every reducing collective.

#include <cstddef>
#include <strata/types.hpp>

namespace strata::kernels {

/// How a reduction writes its result. Auto: through the cache, except results of 8 MiB and
/// more (they leave the cache anyway). Streamed: around the cache at every size, for a result
/// that other cores read next (two-shot's reduced slice; see coll/shm/two_shot.cpp).
/// Streaming needs AVX-512 and 32- or 64-bit elements; elsewhere both write through the cache.
enum class Stores { Auto, Streamed };

/// Results at least this large are written around the cache under Stores::Auto.
inline constexpr size_t kStreamMinBytes = size_t{8} << 20;

/// The store mode for one piece of a result of `total_bytes` reduced in several calls: a
/// piece decides by the whole result's size, not its own, as a single call would.
inline Stores stores_for_whole(Stores requested, size_t total_bytes) {
  return total_bytes >= kStreamMinBytes ? Stores::Streamed : requested;
}

/// dst[i] = op(srcs[0][i], ..., srcs[nsrcs-1][i]) for i < count.
/// Avg sums and divides by `avg_divisor` (the number of ranks), floating types only.
/// float16/bfloat16 accumulate in float32 over all sources and are rounded once.
/// dst may alias any source exactly (not partially overlap).
void reduce(DataType dtype, ReduceOp op, void* dst, const void* const* srcs, int nsrcs, size_t count, int avg_divisor,
            Stores stores = Stores::Auto);

/// Copies bytes; used for every data move so the copy kernel can be tuned in one place.
void copy(void* dst, const void* src, size_t bytes);
/// Copies with non-temporal stores whatever the size (memcpy where the CPU has none): for
/// destinations whose lines other cores hold, where claiming each line costs more than
/// writing around the cache.
void copy_uncached(void* dst, const void* src, size_t bytes);

/// The instruction set the kernels dispatched to on this CPU ("avx512", "avx2", "scalar").
const char* isa();

}  // namespace strata::kernels
