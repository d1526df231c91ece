#include "kernels/cpu/packed_weights.h"

#include <cstring>

namespace moe::cpu {

int64_t PackedLayout::panel_bytes() const {
  return k_padded * kPanelWidth * static_cast<int64_t>(dtype_size(dtype));
}

int64_t PackedLayout::source_row(int64_t pair, int64_t column) const {
  if (gated) {
    const int64_t intermediate = n / 2;
    const int64_t index = pair * kPanelWidth + column % kPanelWidth;
    if (index >= intermediate) return -1;
    return column < kPanelWidth ? index : intermediate + index;
  }
  const int64_t row = pair * kPairWidth + column;
  return row < n ? row : -1;
}

int64_t PackedLayout::element_offset(int64_t k_index, int64_t panel_column) const {
  if (dtype == DType::kBF16)
    return (k_index / 2) * 2 * kPanelWidth + panel_column * 2 + k_index % 2;
  return k_index * kPanelWidth + panel_column;
}

PackedLayout gated_layout(DType dtype, int64_t intermediate, int64_t k) {
  PackedLayout layout = plain_layout(dtype, 2 * intermediate, k);
  layout.num_pairs = (intermediate + kPanelWidth - 1) / kPanelWidth;
  layout.gated = true;
  return layout;
}

PackedLayout plain_layout(DType dtype, int64_t n, int64_t k) {
  PackedLayout layout;
  layout.dtype = dtype;
  layout.n = n;
  layout.k = k;
  layout.k_padded =
      dtype == DType::kBF16 ? (k + kBf16KMultiple - 1) / kBf16KMultiple * kBf16KMultiple : k;
  layout.num_pairs = (n + kPairWidth - 1) / kPairWidth;
  return layout;
}

namespace {

// One pair of panels of one matrix. The 16 source rows of a panel are read side by side, so each
// source row streams forward once and the destination is written in order.
template <typename T>
void pack_pair(const PackedLayout& layout, const T* matrix, int64_t pair, T* dst) {
  const int64_t panel_elements = layout.panel_bytes() / static_cast<int64_t>(sizeof(T));
  for (int64_t half = 0; half < 2; ++half) {
    T* panel = dst + half * panel_elements;
    std::memset(static_cast<void*>(panel), 0, static_cast<size_t>(layout.panel_bytes()));
    for (int64_t c = 0; c < kPanelWidth; ++c) {
      const int64_t row = layout.source_row(pair, half * kPanelWidth + c);
      if (row < 0) continue;
      const T* src = matrix + row * layout.k;
      for (int64_t k = 0; k < layout.k; ++k) panel[layout.element_offset(k, c)] = src[k];
    }
  }
}

template <typename T>
void pack_all(const PackedLayout& layout, const T* src, int64_t num_matrices,
              const int32_t* matrix_ids, T* dst, int num_threads) {
  const int64_t matrix_elements = layout.n * layout.k;
  const int64_t packed_elements = layout.bytes() / static_cast<int64_t>(sizeof(T));
  const int64_t pair_elements = layout.pair_bytes() / static_cast<int64_t>(sizeof(T));
  const int64_t items = num_matrices * layout.num_pairs;
#pragma omp parallel for num_threads(num_threads) schedule(static)
  for (int64_t item = 0; item < items; ++item) {
    const int64_t m = item / layout.num_pairs, pair = item % layout.num_pairs;
    const int64_t source = matrix_ids ? matrix_ids[m] : m;
    pack_pair(layout, src + source * matrix_elements, pair,
              dst + m * packed_elements + pair * pair_elements);
  }
}

}  // namespace

void pack_matrices(const PackedLayout& layout, const void* src, int64_t num_matrices,
                   const int32_t* matrix_ids, void* dst, int num_threads) {
  // Only the bit patterns move, so every 2-byte type packs as uint16_t.
  if (dtype_size(layout.dtype) == 4) {
    pack_all(layout, static_cast<const uint32_t*>(src), num_matrices, matrix_ids,
             static_cast<uint32_t*>(dst), num_threads);
  } else {
    pack_all(layout, static_cast<const uint16_t*>(src), num_matrices, matrix_ids,
             static_cast<uint16_t*>(dst), num_threads);
  }
}

namespace {

template <typename T>
void unpack(const PackedLayout& layout, const T* packed, T* dst) {
  const int64_t panel_elements = layout.panel_bytes() / static_cast<int64_t>(sizeof(T));
  for (int64_t pair = 0; pair < layout.num_pairs; ++pair) {
    for (int64_t column = 0; column < kPairWidth; ++column) {
      const int64_t row = layout.source_row(pair, column);
      if (row < 0) continue;
      const T* panel = packed + (2 * pair + column / kPanelWidth) * panel_elements;
      for (int64_t k = 0; k < layout.k; ++k) {
        dst[row * layout.k + k] = panel[layout.element_offset(k, column % kPanelWidth)];
      }
    }
  }
}

}  // namespace

void unpack_matrix(const PackedLayout& layout, const void* packed, void* dst) {
  if (dtype_size(layout.dtype) == 4) {
    unpack(layout, static_cast<const uint32_t*>(packed), static_cast<uint32_t*>(dst));
  } else {
    unpack(layout, static_cast<const uint16_t*>(packed), static_cast<uint16_t*>(dst));
  }
}

}  // namespace moe::cpu
