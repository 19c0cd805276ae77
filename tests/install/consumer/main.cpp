// Uses an installed Strata through its public headers only.
#include <strata/types.hpp>

#include <cstdio>
#include <cstring>

int main() {
  if (strata::dtype_size(strata::DataType::BFloat16) != 2 || strata::dtype_size(strata::DataType::Float64) != 8) {
    std::fprintf(stderr, "consumer: wrong dtype_size\n");
    return 1;
  }
  if (std::strcmp(strata::to_string(strata::DataType::Float32), "float32") != 0 ||
      std::strcmp(strata::to_string(strata::ReduceOp::Avg), "avg") != 0) {
    std::fprintf(stderr, "consumer: wrong to_string\n");
    return 1;
  }
  std::printf("consumer: %s is %zu bytes\n", strata::to_string(strata::DataType::Float16),
              strata::dtype_size(strata::DataType::Float16));
  return 0;
}
