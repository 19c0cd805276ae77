#pragma once
// Row kernels of MoE combine: weighted float32 accumulation of bf16/fp16/fp32 rows and the
// single rounding back to the payload type.

#include <cstddef>
#include <strata/types.hpp>

namespace strata::moe::kernels {

/// acc[i] += w * float(row[i]) for i < n; row has type `dt` (BFloat16, Float16, Float32).
void accumulate(DataType dt, float* acc, const void* row, float w, size_t n);

/// out[i] = round(acc[i]) to `dt` (round to nearest even; NaN stays NaN).
void store(DataType dt, void* out, const float* acc, size_t n);

/// out[i] = round(0 + w[0] * rows[0][i] + ... + w[n-1] * rows[n-1][i]) for i < H, summed in
/// float32 in that order: the same bits as accumulate() over the rows then store(), in one
/// pass (the partial sums stay in registers instead of a float32 row). `stream`: write `out`
/// around the caches (for outputs much larger than the cache); the caller fences before
/// publishing it to another rank.
void weighted_sum(DataType dt, void* out, const void* const* rows, const float* w, int n, size_t H, bool stream);

/// Copies `bytes` with streaming stores and no fence (the caller calls stream_fence() once
/// after the last row, before publishing them): the per-row copy of a large dispatch.
void copy_streaming_unfenced(void* dst, const void* src, size_t bytes);

/// Orders earlier streaming stores of this thread before its later stores.
void stream_fence();

}  // namespace strata::moe::kernels
