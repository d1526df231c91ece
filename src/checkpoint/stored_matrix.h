// Checkpoint tensors as matrices of floats: the checks on a tensor's dtype and shape (each error
// names the tensor and its file), and the decoding of quantized ones (fp8 with block scales,
// MXFP4). Everything is checked when a StoredMatrix is made, so reading one cannot fail and can
// run on worker threads.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "moe/checkpoint.h"
#include "moe/tensor.h"

namespace moe {

enum class StoredEncoding {
  kFloat,      // values: [rows, cols] f32, bf16, f16 or f64
  kFp8Blocks,  // values: [rows, cols] f8_e4m3; scales: [ceil(rows / block[0]),
               // ceil(cols / block[1])] f32, bf16, f16 or f64 multipliers ("_scale_inv");
               // element (r, c) is values[r, c] * scales[r / block[0], c / block[1]]
  kMxfp4,      // values: [rows, cols / 2] u8, two e2m1 codes per byte, low nibble first;
               // scales: [rows, cols / 32] u8 e8m0 exponents (see mxfp4.h)
};

// One matrix as the checkpoint stores it: a 2-D tensor, one expert's slice of a 3-D tensor (or
// of MXFP4 blocks), or a 1-D tensor seen as a single row.
struct StoredMatrix {
  StoredEncoding encoding = StoredEncoding::kFloat;
  TensorView values;
  TensorView scales;                      // empty for kFloat
  std::array<int64_t, 2> block = {0, 0};  // kFp8Blocks only

  int64_t rows() const { return values.shape[0]; }
  int64_t cols() const {
    return encoding == StoredEncoding::kMxfp4 ? 2 * values.shape[1] : values.shape[1];
  }
};

// Tensor `name` of `checkpoint`, which must have shape `expected` (rank 1, 2 or 3), as one matrix
// per leading index of a 3-D tensor, or one matrix otherwise. `meaning` names the dimensions for
// messages ("[E, 2I, H]"). Throws moe::Error naming the tensor and its file when it is missing,
// misshapen, of a dtype other than f32, bf16, f16, f64 or f8_e4m3, or f8_e4m3 without a matching
// "<name>_scale_inv" tensor of block scales.
std::vector<StoredMatrix> stored_matrices(const Checkpoint& checkpoint, const std::string& name,
                                          const Shape& expected, const char* meaning);

// The MXFP4 pair "<name>_blocks" [E, rows, cols / 32, 16] u8 and "<name>_scales"
// [E, rows, cols / 32] u8 of logical shape `expected` = [E, rows, cols], one matrix per expert.
// Throws moe::Error naming the tensor and its file when either is missing, misshapen or not u8,
// and naming `name` when cols is not a multiple of 32.
std::vector<StoredMatrix> mxfp4_matrices(const Checkpoint& checkpoint, const std::string& name,
                                         const Shape& expected, const char* meaning);

// The matrix's values in f32, [rows, cols] row-major, dequantized when it is quantized.
void dequantize(const StoredMatrix& matrix, float* out);

}  // namespace moe
