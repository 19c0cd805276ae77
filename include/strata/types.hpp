#pragma once
// Value types shared by the whole public API: data types, reduction ops, error codes.

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace strata {

/// Element type of a buffer taking part in a collective.
enum class DataType : uint8_t { Int8, UInt8, Int32, UInt32, Int64, UInt64, Float16, BFloat16, Float32, Float64 };

/// Reduction operator. Avg is defined for floating types only; the bitwise BAnd, BOr and
/// BXor for integer types only.
enum class ReduceOp : uint8_t { Sum, Prod, Min, Max, Avg, BAnd, BOr, BXor };
/// True for BAnd, BOr, BXor.
inline constexpr bool is_bitwise(ReduceOp op) {
  return op == ReduceOp::BAnd || op == ReduceOp::BOr || op == ReduceOp::BXor;
}

/// Error codes; each tells the caller how to recover.
/// InvalidArgument: fix the call. Timeout: a peer was too slow or is stopped.
/// PeerFailed: a peer died; recover the communicator. Aborted: abort() or revocation.
/// Unavailable: a resource (store, socket) is not reachable yet; retry later. Internal: a bug.
enum class Code : uint8_t { Ok, InvalidArgument, Timeout, PeerFailed, Aborted, Unavailable, Internal };

/// Size in bytes of one element of `t`.
size_t dtype_size(DataType t);
/// Lower-case name ("float32", "bfloat16", ...).
const char* to_string(DataType t);
/// Lower-case name ("sum", "avg", ...).
const char* to_string(ReduceOp op);
/// Name of a code ("InvalidArgument", ...).
const char* to_string(Code c);
/// True for Float16, BFloat16, Float32, Float64.
bool is_floating(DataType t);

/// IEEE 754 half precision, stored as its bit pattern.
struct float16_t {
  uint16_t bits = 0;
  friend bool operator==(float16_t a, float16_t b) { return a.bits == b.bits; }
};
/// bfloat16 (upper half of a float32), stored as its bit pattern.
struct bfloat16_t {
  uint16_t bits = 0;
  friend bool operator==(bfloat16_t a, bfloat16_t b) { return a.bits == b.bits; }
};

/// Conversions with round-to-nearest-even; NaN stays NaN.
float to_float(float16_t h);
float to_float(bfloat16_t h);
float16_t to_float16(float f);
bfloat16_t to_bfloat16(float f);

/// The DataType matching a C++ element type.
template <class T>
struct dtype_of;
template <>
struct dtype_of<int8_t> {
  static constexpr DataType value = DataType::Int8;
};
template <>
struct dtype_of<uint8_t> {
  static constexpr DataType value = DataType::UInt8;
};
template <>
struct dtype_of<int32_t> {
  static constexpr DataType value = DataType::Int32;
};
template <>
struct dtype_of<uint32_t> {
  static constexpr DataType value = DataType::UInt32;
};
template <>
struct dtype_of<int64_t> {
  static constexpr DataType value = DataType::Int64;
};
template <>
struct dtype_of<uint64_t> {
  static constexpr DataType value = DataType::UInt64;
};
template <>
struct dtype_of<float16_t> {
  static constexpr DataType value = DataType::Float16;
};
template <>
struct dtype_of<bfloat16_t> {
  static constexpr DataType value = DataType::BFloat16;
};
template <>
struct dtype_of<float> {
  static constexpr DataType value = DataType::Float32;
};
template <>
struct dtype_of<double> {
  static constexpr DataType value = DataType::Float64;
};
template <class T>
inline constexpr DataType dtype_of_v = dtype_of<std::remove_cv_t<T>>::value;

/// What the public API throws. `rank` is the rank that raised it, `peer` the other rank
/// involved (-1 when none).
class Error : public std::runtime_error {
 public:
  Error(Code code, const std::string& message, int rank = -1, int peer = -1)
      : std::runtime_error(message), code_(code), rank_(rank), peer_(peer) {}
  /// How to recover (see Code).
  Code code() const { return code_; }
  /// The rank that raised the error, -1 if not known.
  int rank() const { return rank_; }
  /// The peer rank involved, -1 when none.
  int peer() const { return peer_; }

 private:
  Code code_;
  int rank_;
  int peer_;
};

}  // namespace strata
