// The packed layout every CPU experts kernel streams its weights from.
//
// A weight matrix [n, k] (n output features, each a row of k inputs) is cut into panels of
// kPanelWidth = 16 rows. A panel is stored k-major, so each step along k reads one contiguous
// 64-byte group holding that step for all 16 outputs:
//   bf16:     [k_padded / 2][16][2]  pairs of k interleaved: exactly an AMX B tile row and a
//             vdpbf16ps operand; the f32 paths widen the same 64 bytes with a shift and a mask
//   f32, f16: [k][16]
// Panels go in pairs: a kernel computes 32 outputs at once. In a gated matrix (w13: gate rows,
// then up rows) pair j holds gate rows 16j.. and up rows I+16j.., so gemm1's epilogue has the
// gate and up value of the same intermediate index in hand and writes act() directly; otherwise
// pair j holds rows 32j..32j+31. Rows past the end and bf16's k padding are zeros.
//
// One layout serves every instruction-set path, so a layer packs once and any path (including
// one forced with MOE_CPU_ISA) runs on it. Tested by tests/kernels/packed_weights_test.cc.
#pragma once

#include <cstdint>

#include "moe/dtype.h"

namespace moe::cpu {

inline constexpr int64_t kPanelWidth = 16;              // outputs per panel
inline constexpr int64_t kPairWidth = 2 * kPanelWidth;  // outputs per kernel call
inline constexpr int64_t kBf16KMultiple = 32;           // AMX tiles take k in steps of 32

// The packed form of one expert's [n, k] matrix.
struct PackedLayout {
  DType dtype = DType::kBF16;  // f32, f16 or bf16
  int64_t n = 0;               // logical rows (2I for a gated matrix)
  int64_t k = 0;               // logical columns
  int64_t k_padded = 0;        // bf16: k rounded up to kBf16KMultiple; else k
  int64_t num_pairs = 0;       // panel pairs
  bool gated = false;

  int64_t panel_bytes() const;
  int64_t pair_bytes() const { return 2 * panel_bytes(); }
  int64_t bytes() const { return num_pairs * pair_bytes(); }  // one expert
  // The source row of output `column` (0..31) of pair `pair`, or -1 for a padding row.
  int64_t source_row(int64_t pair, int64_t column) const;
  // Element offset of (k index, column within the panel) inside a panel.
  int64_t element_offset(int64_t k_index, int64_t panel_column) const;
};

// w13-style matrix [2 * intermediate, k]: pairs of (gate panel, up panel).
PackedLayout gated_layout(DType dtype, int64_t intermediate, int64_t k);
// A plain [n, k] matrix: pairs of consecutive panels.
PackedLayout plain_layout(DType dtype, int64_t n, int64_t k);

// Packs `num_matrices` consecutive matrices of `layout` ([num_matrices, n, k] of layout.dtype)
// into `dst` [num_matrices * layout.bytes()]; matrix e lands at dst + e * layout.bytes().
// `matrix_ids`, when given, names which of the source matrices to pack, in order.
void pack_matrices(const PackedLayout& layout, const void* src, int64_t num_matrices,
                   const int32_t* matrix_ids, void* dst, int num_threads);

// The inverse for one matrix: packed -> [n, k] of layout.dtype.
void unpack_matrix(const PackedLayout& layout, const void* packed, void* dst);

}  // namespace moe::cpu
