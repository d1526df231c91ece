// Checks on checkpoint tensors, and their conversion to f32 with fp8 block dequantization and
// MXFP4 decoding.
#include "checkpoint/stored_matrix.h"

#include "checkpoint/mxfp4.h"
#include "moe/dtype.h"
#include "moe/error.h"

namespace moe {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Matrix `index` of a contiguous [n, rows, ...] tensor, its trailing dimensions flattened.
TensorView slice(const TensorView& t, int64_t index) {
  const int64_t rows = t.shape[1];
  int64_t cols = 1;
  for (size_t d = 2; d < t.shape.size(); ++d) cols *= t.shape[d];
  char* first = static_cast<char*>(t.data) + index * rows * cols * dtype_size(t.dtype);
  return TensorView(first, t.dtype, {rows, cols});
}

TensorView as_matrix(const TensorView& t) {
  return t.dim() == 1 ? TensorView(t.data, t.dtype, {1, t.shape[0]}) : t;
}

// The block scales of fp8 tensor `name`, checked against its shape.
TensorView scales_of(const Checkpoint& checkpoint, const std::string& name,
                     const TensorView& values) {
  const std::string file = checkpoint.file_of(name);
  if (values.dim() == 1) {
    fail(
        "tensor \"{}\" in {}: an f8_e4m3 vector; only fp8 matrices (with block scales) are "
        "supported",
        name, file);
  }
  const std::string scale_name = name + "_scale_inv";
  if (!checkpoint.contains(scale_name)) {
    fail(
        "tensor \"{}\" in {}: f8_e4m3 without its block scales; expected a tensor \"{}\" in "
        "checkpoint {}",
        name, file, scale_name, checkpoint.dir());
  }
  const TensorView scales = checkpoint.tensor(scale_name);
  const std::string scale_file = checkpoint.file_of(scale_name);
  if (!is_floating(scales.dtype) || scales.dtype == DType::kF8E4M3) {
    fail("tensor \"{}\" in {}: dtype {}; expected f32, bf16, f16 or f64 block scales", scale_name,
         scale_file, dtype_name(scales.dtype));
  }
  const auto& [block_rows, block_cols] = checkpoint.fp8_block();
  Shape expected = values.shape;
  const size_t rank = expected.size();
  expected[rank - 2] = ceil_div(expected[rank - 2], block_rows);
  expected[rank - 1] = ceil_div(expected[rank - 1], block_cols);
  if (scales.shape != expected) {
    fail(
        "tensor \"{}\" in {}: expected shape {} (one scale per {} x {} block of \"{}\", shape "
        "{}); got {}",
        scale_name, scale_file, shape_string(expected), block_rows, block_cols, name,
        shape_string(values.shape), shape_string(scales.shape));
  }
  return scales;
}

}  // namespace

std::vector<StoredMatrix> stored_matrices(const Checkpoint& checkpoint, const std::string& name,
                                          const Shape& expected, const char* meaning) {
  const TensorView values = checkpoint.tensor(name);  // throws naming the tensor when missing
  const std::string file = checkpoint.file_of(name);
  if (!is_floating(values.dtype)) {
    fail(
        "tensor \"{}\" in {}: dtype {}; expected f32, bf16, f16, f64, or f8_e4m3 with block "
        "scales",
        name, file, dtype_name(values.dtype));
  }
  if (values.shape != expected) {
    fail("tensor \"{}\" in {}: expected shape {} ({}); got {}", name, file, shape_string(expected),
         meaning, shape_string(values.shape));
  }
  TensorView scales;
  if (values.dtype == DType::kF8E4M3) scales = scales_of(checkpoint, name, values);

  const StoredEncoding encoding =
      scales.empty() ? StoredEncoding::kFloat : StoredEncoding::kFp8Blocks;
  const std::array<int64_t, 2> block =
      scales.empty() ? std::array<int64_t, 2>{0, 0} : checkpoint.fp8_block();
  std::vector<StoredMatrix> matrices;
  if (values.dim() == 3) {
    for (int64_t i = 0; i < values.shape[0]; ++i) {
      matrices.push_back(
          {encoding, slice(values, i), scales.empty() ? TensorView() : slice(scales, i), block});
    }
  } else {
    matrices.push_back({encoding, as_matrix(values), scales, block});
  }
  return matrices;
}

std::vector<StoredMatrix> mxfp4_matrices(const Checkpoint& checkpoint, const std::string& name,
                                         const Shape& expected, const char* meaning) {
  const int64_t experts = expected[0], rows = expected[1], cols = expected[2];
  if (cols % kMxfp4GroupSize != 0) {
    fail(
        "tensor \"{}\" in checkpoint {}: MXFP4 with an input dimension of {} ({}); expected a "
        "multiple of {}, the MXFP4 group size",
        name, checkpoint.dir(), cols, meaning, kMxfp4GroupSize);
  }
  const int64_t groups = cols / kMxfp4GroupSize;
  // Both tensors are read as bytes, so anything but u8 (an f32 dequantized copy saved under the
  // quantized name, say) is refused rather than reinterpreted.
  const auto checked = [&](const std::string& tensor, const Shape& shape, const char* what) {
    const TensorView view = checkpoint.tensor(tensor);  // throws naming the tensor when missing
    const std::string file = checkpoint.file_of(tensor);
    if (view.dtype != DType::kU8) {
      fail("tensor \"{}\" in {}: dtype {}; expected u8 MXFP4 {}", tensor, file,
           dtype_name(view.dtype), what);
    }
    if (view.shape != shape) {
      fail("tensor \"{}\" in {}: expected shape {} (MXFP4 {} of {} {}); got {}", tensor, file,
           shape_string(shape), what, name, meaning, shape_string(view.shape));
    }
    return view;
  };
  const TensorView blocks = checked(name + "_blocks", {experts, rows, groups, kMxfp4BytesPerGroup},
                                    "blocks [E, out, in / 32, 16], two e2m1 codes per byte");
  const TensorView scales =
      checked(name + "_scales", {experts, rows, groups}, "scales [E, out, in / 32], e8m0");
  std::vector<StoredMatrix> matrices;
  for (int64_t e = 0; e < experts; ++e) {
    matrices.push_back({StoredEncoding::kMxfp4, slice(blocks, e), slice(scales, e), {0, 0}});
  }
  return matrices;
}

namespace {

void dequantize_fp8_blocks(const StoredMatrix& matrix, float* out) {
  const int64_t rows = matrix.rows(), cols = matrix.cols();
  convert_to_f32(matrix.values.data, matrix.values.dtype, out, static_cast<size_t>(rows * cols));
  const int64_t scale_cols = matrix.scales.shape[1];
  const size_t scale_row_bytes = static_cast<size_t>(scale_cols) * dtype_size(matrix.scales.dtype);
  std::vector<float> scales(static_cast<size_t>(scale_cols));
  for (int64_t r = 0; r < rows; ++r) {
    if (r % matrix.block[0] == 0) {
      const char* scale_row =
          static_cast<const char*>(matrix.scales.data) + (r / matrix.block[0]) * scale_row_bytes;
      convert_to_f32(scale_row, matrix.scales.dtype, scales.data(), scales.size());
    }
    float* row = out + r * cols;
    for (int64_t c = 0; c < cols; ++c) row[c] *= scales[static_cast<size_t>(c / matrix.block[1])];
  }
}

void dequantize_mxfp4(const StoredMatrix& matrix, float* out) {
  const int64_t rows = matrix.rows(), cols = matrix.cols();
  const int64_t row_bytes = matrix.values.shape[1], row_scales = matrix.scales.shape[1];
  const auto* packed = static_cast<const uint8_t*>(matrix.values.data);
  const auto* scales = static_cast<const uint8_t*>(matrix.scales.data);
  for (int64_t r = 0; r < rows; ++r) {
    dequantize_mxfp4_row(packed + r * row_bytes, scales + r * row_scales, cols, out + r * cols);
  }
}

}  // namespace

void dequantize(const StoredMatrix& matrix, float* out) {
  switch (matrix.encoding) {
    case StoredEncoding::kFloat:
      convert_to_f32(matrix.values.data, matrix.values.dtype, out,
                     static_cast<size_t>(matrix.rows() * matrix.cols()));
      return;
    case StoredEncoding::kFp8Blocks:
      dequantize_fp8_blocks(matrix, out);
      return;
    case StoredEncoding::kMxfp4:
      dequantize_mxfp4(matrix, out);
      return;
  }
}

}  // namespace moe
