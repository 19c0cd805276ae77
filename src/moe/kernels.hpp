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

}  // namespace strata::moe::kernels
