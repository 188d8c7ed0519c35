// levanter/models/matmul_shape.hpp: the matrix products of a model's forward pass, as the trainer measures its GEMM
// peak on them (MFU's denominator, trainer/run.hpp).
#pragma once

#include <cstdint>

namespace levanter {

/// A weight of `n` outputs by `k` inputs applied to every token, `count` times per forward pass (once per layer, or
/// once for the LM head).
struct matmul_shape {
  std::int64_t n = 0, k = 0;
  double count = 1;
};

}  // namespace levanter
