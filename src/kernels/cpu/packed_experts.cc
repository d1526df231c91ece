#include "kernels/cpu/packed_experts.h"

#include "kernels/cpu/huge_pages.h"

namespace moe::cpu {

namespace {

Tensor pack_stack(const PackedLayout& layout, const void* src, int64_t count, int num_threads,
                  std::vector<const uint8_t*>& table) {
  Tensor packed(DType::kU8, {count * layout.bytes()});
  advise_huge_pages(packed.data<void>(), count * layout.bytes());
  pack_matrices(layout, src, count, nullptr, packed.data<void>(), num_threads);
  for (int64_t e = 0; e < count; ++e) table.push_back(packed.data<uint8_t>() + e * layout.bytes());
  return packed;
}

Tensor unpack_stack(const PackedLayout& layout, const Tensor& packed, int64_t count) {
  if (!packed.defined()) return Tensor();
  Tensor out(layout.dtype, {count, layout.n, layout.k});
  const int64_t matrix_bytes = layout.n * layout.k * static_cast<int64_t>(dtype_size(layout.dtype));
  for (int64_t e = 0; e < count; ++e) {
    unpack_matrix(layout, packed.data<uint8_t>() + e * layout.bytes(),
                  out.data<uint8_t>() + e * matrix_bytes);
  }
  return out;
}

Tensor unpack_one(const PackedLayout& layout, const Tensor& packed) {
  if (!packed.defined()) return Tensor();
  Tensor out(layout.dtype, {layout.n, layout.k});
  unpack_matrix(layout, packed.data<void>(), out.data<void>());
  return out;
}

}  // namespace

PackedExperts PackedExperts::pack(const ExpertsProblem& pb, int num_threads) {
  PackedExperts p;
  const int64_t H = pb.hidden_size, I = pb.intermediate_size;
  p.num_experts_ = pb.num_local_experts;
  p.w13_layout_ = gated_layout(pb.weight_dtype, I, H);
  p.w2_layout_ = plain_layout(pb.weight_dtype, H, I);
  p.w13_ = pack_stack(p.w13_layout_, pb.w13, p.num_experts_, num_threads, p.w13_table_);
  p.w2_ = pack_stack(p.w2_layout_, pb.w2, p.num_experts_, num_threads, p.w2_table_);
  p.pack_shared_weights(pb, num_threads);
  return p;
}

PackedExperts PackedExperts::pack_shared(const ExpertsProblem& pb, int num_threads) {
  PackedExperts p;
  p.pack_shared_weights(pb, num_threads);
  return p;
}

void PackedExperts::pack_shared_weights(const ExpertsProblem& pb, int num_threads) {
  const int64_t H = pb.hidden_size;
  if (pb.shared_intermediate_size > 0) {
    const int64_t Is = pb.shared_intermediate_size;
    shared_w13_layout_ = gated_layout(pb.weight_dtype, Is, H);
    shared_w2_layout_ = plain_layout(pb.weight_dtype, H, Is);
    shared_w13_ = pack_stack(shared_w13_layout_, pb.shared_w13, 1, num_threads, shared_tables_);
    shared_w2_ = pack_stack(shared_w2_layout_, pb.shared_w2, 1, num_threads, shared_tables_);
  }
}

PackedExpertsView PackedExperts::view() const {
  PackedExpertsView v;
  v.w13 = w13_layout_;
  v.w2 = w2_layout_;
  v.w13_experts = w13_table_.data();
  v.w2_experts = w2_table_.data();
  if (shared_w13_.defined()) {
    v.shared_w13 = shared_w13_layout_;
    v.shared_w2 = shared_w2_layout_;
    v.shared_w13_data = &shared_tables_[0];
    v.shared_w2_data = &shared_tables_[1];
  }
  return v;
}

int64_t PackedExperts::nbytes() const {
  int64_t total = 0;
  for (const Tensor* t : {&w13_, &w2_, &shared_w13_, &shared_w2_}) {
    if (t->defined()) total += static_cast<int64_t>(t->nbytes());
  }
  return total;
}

Tensor PackedExperts::unpack_w13() const { return unpack_stack(w13_layout_, w13_, num_experts_); }
Tensor PackedExperts::unpack_w2() const { return unpack_stack(w2_layout_, w2_, num_experts_); }

Tensor PackedExperts::unpack_shared_w13() const {
  return unpack_one(shared_w13_layout_, shared_w13_);
}

Tensor PackedExperts::unpack_shared_w2() const { return unpack_one(shared_w2_layout_, shared_w2_); }

}  // namespace moe::cpu
