// Routing ties between a layer and the float64 reference. Routers accumulate logits in float32
// (the reference in float64), so where two experts' logits lie within rounding of each other a
// correct layer may pick either: `moe run` and its --ep checks must not call that a wrong result.
#pragma once

#include <cstdint>
#include <string>

#include "moe/layer.h"

namespace moe::cli {

// How far apart two logits may be, relative to the token's largest logit, and still count as a
// tie. float32 sums of a few thousand products stay orders of magnitude inside it; the gap between
// a token's k-th and (k+1)-th experts is typically a few percent.
inline constexpr double kRoutingTieBand = 1e-4;

// Whether `ids` (one token's k experts, in the layer's order) is the reference's routing of
// `hidden_row` (H floats) up to ties: rerun on the token's float64 logits with each of the layer's
// experts moved up by at most the band (the first the most, so that their order is the layer's)
// and every other expert moved down by the band, the reference routing picks exactly `ids`.
// `reference` is a layer on the reference backend; its router and biases are read.
bool routed_at_a_tie(const MoeLayer& reference, const float* hidden_row, const int32_t* ids);

// "2 routed wrongly, 1 routed at a tie" for the checked tokens' report; empty when both are 0.
std::string routing_note(int64_t misrouted, int64_t routed_at_ties);

// What a layer's output on `hidden` (f32 [n, H]) should be, given the routing it chose (`ids`
// int32 and `weights` f32, [n, k]): the reference's output, except that a token the layer routed
// otherwise at a tie gets the reference's experts on the layer's routing. A token routed
// otherwise beyond a tie is counted and keeps the reference's own output.
struct ReferenceOutput {
  Tensor expected;  // [n, H] f32
  int64_t misrouted = 0;
  int64_t routed_at_ties = 0;
};
ReferenceOutput reference_output(MoeLayer& reference, const Tensor& hidden, const TensorView& ids,
                                 const TensorView& weights);

}  // namespace moe::cli
