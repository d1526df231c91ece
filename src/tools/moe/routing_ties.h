// Routing ties between a layer and the float64 reference. Routers accumulate logits in float32
// (the reference in float64), so where two experts' logits lie within rounding of each other a
// correct layer may pick either: `moe run` must not report that as a wrong result.
#pragma once

#include <cstdint>

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

}  // namespace moe::cli
