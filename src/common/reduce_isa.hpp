#pragma once
// Explicit instruction-set choice for the reduction kernels of reduce.hpp. The library itself
// calls kernels::reduce(), which uses active(); tests, benchmarks and `strata info` use this
// header to name, check and call one instruction set directly.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <strata/types.hpp>
#include <string_view>

#include "common/reduce.hpp"

namespace strata::kernels {

/// A set of kernels, from the most portable to the widest.
enum class Isa : uint8_t { Scalar, Avx2, Avx512 };

inline constexpr Isa kAllIsas[] = {Isa::Scalar, Isa::Avx2, Isa::Avx512};

/// "scalar", "avx2", "avx512".
const char* to_string(Isa isa);
/// Parses the names above (case-insensitive); nullopt for anything else.
std::optional<Isa> parse_isa(std::string_view name);
/// True when this CPU and OS can run `isa`: avx2 needs AVX2+FMA+F16C, avx512 needs
/// AVX-512 F/BW/VL/DQ (the bfloat16 conversion instructions are used when present).
bool supported(Isa isa);
/// The widest supported set.
Isa best_supported();
/// The set reduce() and copy() use: STRATA_KERNELS when it names a supported set (else the
/// widest supported set below it), otherwise best_supported(). Chosen once per process.
Isa active();

/// reduce() with an explicit instruction set; `isa` must be supported().
void reduce(Isa isa, DataType dtype, ReduceOp op, void* dst, const void* const* srcs, int nsrcs, size_t count,
            int avg_divisor, Stores stores = Stores::Auto);

}  // namespace strata::kernels
