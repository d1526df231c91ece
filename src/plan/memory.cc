// Memory of one device: resident weights part by part, the KV-cache budget left after them and
// a reserve, and whether the requested context * concurrency fits; if not, which term is to
// blame and what would change it.
#include <algorithm>
#include <array>
#include <cmath>
#include <utility>

#include <fmt/format.h>

#include "moe/error.h"
#include "moe/params.h"
#include "plan/terms.h"

namespace moe::planning {
namespace {

// Quantized checkpoints keep embeddings, norms and router in bf16 (their share of bytes is
// small and their precision matters); a float format applies to everything.
StorageFormat side_format(StorageFormat weights) {
  return storage_bits(weights) >= 16 ? weights : StorageFormat::kBF16;
}

std::string gigabytes(double bytes) { return fmt::format("{:.1f} GB", bytes * 1e-9); }

int64_t checked_mul(int64_t a, int64_t b, std::string_view what) {
  int64_t product = 0;
  if (__builtin_mul_overflow(a, b, &product)) fail("{}: overflows int64 ({} * {})", what, a, b);
  return product;
}

int64_t reserve_of(const DeploymentSpec& spec, int64_t capacity) {
  if (spec.reserve_bytes) {
    if (*spec.reserve_bytes < 0 || *spec.reserve_bytes >= capacity) {
      fail("reserve_bytes: expected 0 <= reserve < device memory ({} bytes); got {}", capacity,
           *spec.reserve_bytes);
    }
    return *spec.reserve_bytes;
  }
  if (!(spec.reserve_fraction >= 0 && spec.reserve_fraction < 1)) {
    fail("reserve_fraction: expected 0 <= fraction < 1; got {}", spec.reserve_fraction);
  }
  return static_cast<int64_t>(std::llround(spec.reserve_fraction * static_cast<double>(capacity)));
}

std::string weights_reason(const MemoryPlan& m) {
  const WeightBytes& w = m.resident;
  const std::array<std::pair<std::string_view, int64_t>, 7> parts = {{
      {"routed experts", w.routed_experts},
      {"attention", w.attention},
      {"embeddings", w.embedding},
      {"dense FFNs", w.dense_ffn},
      {"shared experts", w.shared_experts},
      {"router", w.router},
      {"norms", w.norms},
  }};
  const auto* largest = &parts[0];
  for (const auto& part : parts) {
    if (part.second > largest->second) largest = &part;
  }
  const std::string_view remedy =
      largest == &parts[0]
          ? "spread the routed experts over more devices (expert parallelism, larger tp or dp) "
            "or store them in fewer bits"
          : "split the weights over more devices (larger tp) or store them in fewer bits";
  return fmt::format(
      "weights need {} per device, more than the {} left of {} after the {} reserve; the "
      "largest part is {} ({}): {}",
      gigabytes(w.total()), gigabytes(m.capacity_bytes - m.reserve_bytes),
      gigabytes(m.capacity_bytes), gigabytes(m.reserve_bytes), largest->first,
      gigabytes(largest->second), remedy);
}

std::string kv_reason(const MemoryPlan& m, const DeploymentSpec& spec, int64_t sequences) {
  return fmt::format(
      "the KV cache of {} sequences x {} tokens per DP group needs {} per device ({} bytes per "
      "token), but {} is left after weights and the reserve: {} tokens, {} sequences of {} "
      "tokens over the deployment; lower the context or concurrency, store the KV cache in fp8, "
      "or add devices",
      sequences, spec.context_len,
      gigabytes(static_cast<double>(m.requested_tokens_per_group) *
                static_cast<double>(m.kv_bytes_per_token)),
      m.kv_bytes_per_token, gigabytes(std::max<double>(m.kv_budget_bytes, 0)),
      m.kv_tokens_per_group, m.max_concurrency, spec.context_len);
}

}  // namespace

int64_t format_bytes(int64_t params, StorageFormat format) {
  // params / 8 * bits + the remainder's bits: exact, and overflows only if the bytes do.
  const int64_t bits = storage_bits(format);
  const int64_t whole = checked_mul(params / 8, bits, "weight bytes");
  return whole + params % 8 * bits / 8;
}

WeightBytes resident_weight_bytes(const MoeConfig& config, const DeviceParams& params,
                                  StorageFormat weights) {
  const StorageFormat side = side_format(weights);
  const int64_t num_layers = config.num_layers;
  const int64_t num_moe = config.num_moe_layers();
  WeightBytes bytes;
  bytes.attention = format_bytes(params.attention_per_layer * num_layers, weights);
  bytes.embedding = format_bytes(params.embedding, side);
  bytes.dense_ffn = format_bytes(params.dense_ffn_per_layer * (num_layers - num_moe), weights);
  bytes.shared_experts = format_bytes(params.shared_experts_per_layer * num_moe, weights);
  bytes.routed_experts =
      format_bytes(params.expert_slice * params.experts_per_device * num_moe, weights);
  bytes.router = format_bytes(params.router_per_layer * num_moe, side);
  bytes.norms = format_bytes(params.norms, side);
  return bytes;
}

MemoryPlan plan_memory(const MoeConfig& config, const Hardware& hardware,
                       const DeploymentSpec& spec, const Layout& layout) {
  const ParamCounts counts = count_params(config);
  const DeviceParams params = device_params(config, layout);
  const int64_t num_moe = config.num_moe_layers();
  const StorageFormat side = side_format(spec.weights);
  const int64_t side_params =
      counts.embedding + counts.norms_total + counts.router_per_layer * num_moe;

  MemoryPlan m;
  m.model_weight_bytes =
      format_bytes(counts.total - side_params, spec.weights) + format_bytes(side_params, side);
  m.active_weight_bytes_per_token =
      format_bytes(counts.active_per_token - side_params, spec.weights) +
      format_bytes(side_params, side);
  m.resident = resident_weight_bytes(config, params, spec.weights);
  // A token's k experts lie on one device k / EP times on average (EP), or as k slices (no EP).
  const double routed_per_token = static_cast<double>(config.routing.top_k) *
                                  static_cast<double>(params.expert_slice * num_moe) /
                                  static_cast<double>(layout.ep);
  m.active_weight_bytes_per_token_per_device =
      static_cast<double>(m.resident.total() - m.resident.routed_experts) +
      routed_per_token * static_cast<double>(storage_bits(spec.weights)) / 8;

  m.capacity_bytes = hardware.memory_bytes;
  m.reserve_bytes = reserve_of(spec, m.capacity_bytes);
  m.kv_budget_bytes = m.capacity_bytes - m.reserve_bytes - m.resident.total();
  m.kv_bytes_per_token = kv_bytes_per_token(config, layout.tp, spec.kv_cache);
  m.kv_tokens_per_group = std::max<int64_t>(m.kv_budget_bytes, 0) / m.kv_bytes_per_token;
  const int64_t sequences = (spec.concurrency + layout.dp - 1) / layout.dp;
  m.requested_tokens_per_group = checked_mul(spec.context_len, sequences, "context * concurrency");
  m.max_concurrency = layout.dp * (m.kv_tokens_per_group / spec.context_len);

  if (m.kv_budget_bytes <= 0) {
    m.fit = Fit::kWeightsTooLarge;
    m.reason = weights_reason(m);
  } else if (m.requested_tokens_per_group > m.kv_tokens_per_group) {
    m.fit = Fit::kKvCacheTooSmall;
    m.reason = kv_reason(m, spec, sequences);
  }
  return m;
}

}  // namespace moe::planning
