// Checkpoint tensors as matrices of floats: the checks on a tensor's dtype and shape (each error
// names the tensor and its file), and fp8 block dequantization. Everything is checked when a
// StoredMatrix is made, so reading one cannot fail and can run on worker threads.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "moe/checkpoint.h"
#include "moe/tensor.h"

namespace moe {

// One matrix as the checkpoint stores it: a 2-D tensor, one expert's slice of a 3-D tensor, or
// a 1-D tensor seen as a single row.
struct StoredMatrix {
  TensorView values;  // [rows, cols], any float dtype
  // f8_e4m3 values only: [ceil(rows / block[0]), ceil(cols / block[1])] f32, bf16 or f16; the
  // value of element (r, c) is values[r, c] * scale_inv[r / block[0], c / block[1]].
  TensorView scale_inv;
  std::array<int64_t, 2> block = {0, 0};

  int64_t rows() const { return values.shape[0]; }
  int64_t cols() const { return values.shape[1]; }
};

// Tensor `name` of `checkpoint`, which must have shape `expected` (rank 1, 2 or 3), as one matrix
// per leading index of a 3-D tensor, or one matrix otherwise. `meaning` names the dimensions for
// messages ("[E, 2I, H]"). Throws moe::Error naming the tensor and its file when it is missing,
// misshapen, of a dtype other than f32, bf16, f16, f64 or f8_e4m3, or f8_e4m3 without a matching
// "<name>_scale_inv" tensor of block scales.
std::vector<StoredMatrix> stored_matrices(const Checkpoint& checkpoint, const std::string& name,
                                          const Shape& expected, const char* meaning);

// The matrix's values in f32, [rows, cols] row-major, dequantized when it is fp8.
void dequantize(const StoredMatrix& matrix, float* out);

}  // namespace moe
