// `moe plan` output. The table prints decimal GB (1e9 bytes), as the seeds and spec sheets do;
// the JSON carries exact bytes, flops and seconds.
#include "tools/moe/plan_report.h"

#include <string>

#include <fmt/format.h>

namespace moe::cli {
namespace {

std::string gb(double bytes) { return fmt::format("{:.2f}", bytes * 1e-9); }
std::string ms(double seconds) { return fmt::format("{:.3f}", seconds * 1e3); }
std::string mb(double bytes) { return fmt::format("{:.2f}", bytes * 1e-6); }
std::string tflop(double flops) { return fmt::format("{:.2f}", flops * 1e-12); }
std::string_view plural(int64_t count) { return count == 1 ? "" : "s"; }

void print_header(const Plan& p) {
  const DeploymentSpec& s = p.spec;
  const Hardware& hw = p.hardware;
  const std::string experts = p.ep > 1 ? fmt::format("ep {}", p.ep)
                              : p.num_devices == 1
                                  ? std::string("one device")
                                  : fmt::format("no ep: experts split {} ways", p.num_devices);
  fmt::print("moe plan: {} on {} x {} ({} node{} of {}), tp {}, dp {}, {}\n", p.model,
             p.num_devices, hw.name, p.num_nodes, plural(p.num_nodes), p.devices_per_node, s.tp,
             s.dp, experts);
  fmt::print("  device    {}: {:.0f} GB at {:.2f} TB/s, {:.0f} TFLOP/s 16-bit", hw.description,
             static_cast<double>(hw.memory_bytes) * 1e-9, hw.memory_bytes_per_s * 1e-12,
             hw.peak_flops_16bit * 1e-12);
  if (hw.peak_flops_fp8 > 0) fmt::print(", {:.0f} fp8", hw.peak_flops_fp8 * 1e-12);
  fmt::print(" (peak figures)\n");
  if (p.num_devices > 1) {
    fmt::print("            links {:.0f} GB/s in a node, {:.0f} GB/s across, per direction\n",
               hw.link_bytes_per_s * 1e-9, hw.network_bytes_per_s * 1e-9);
  }
  fmt::print("  load      weights {}, KV cache {}, dispatch {}; {} sequence{} of {} tokens\n",
             storage_format_name(s.weights), storage_format_name(s.kv_cache),
             storage_format_name(s.dispatch), s.concurrency, plural(s.concurrency), s.context_len);
}

void print_memory(const Plan& p) {
  const MemoryPlan& m = p.memory;
  const WeightBytes& w = m.resident;
  const auto row = [](std::string_view name, double bytes, std::string_view note = "") {
    fmt::print("  {:<26} {:>10}  {}\n", name, gb(bytes), note);
  };
  fmt::print("\nmemory per device               GB\n");
  row("attention", w.attention);
  row("embeddings and head", w.embedding);
  row("dense FFNs", w.dense_ffn);
  row("shared experts", w.shared_experts);
  row("routed experts", w.routed_experts,
      p.ep > 1             ? fmt::format("{} experts of each layer", p.experts_per_device)
      : p.num_devices == 1 ? std::string("all experts")
                           : fmt::format("1/{} of every expert", p.num_devices));
  row("router and norms", w.router + w.norms);
  row("resident weights", w.total(),
      fmt::format("model {} GB ({:.2f} GiB); active per token {} GB, {} GB of it here",
                  gb(m.model_weight_bytes), m.model_weight_bytes / 1073741824.0,
                  gb(m.active_weight_bytes_per_token),
                  gb(m.active_weight_bytes_per_token_per_device)));
  row("reserve", m.reserve_bytes);
  row("left for KV cache", m.kv_budget_bytes, fmt::format("of {} GB", gb(m.capacity_bytes)));
  fmt::print("  {:<26} {:>10}  bytes per token\n", "KV cache", m.kv_bytes_per_token);
  fmt::print("  {:<26} {:>10}  tokens per DP group; requested {}; at most {} sequences\n",
             "KV capacity", m.kv_tokens_per_group, m.requested_tokens_per_group, m.max_concurrency);
  if (m.fit == Fit::kFits) {
    fmt::print("  fits\n");
  } else {
    fmt::print("  DOES NOT FIT ({}): {}\n", fit_name(m.fit), m.reason);
  }
}

void print_stages(const Plan& p) {
  const StagePlan& a = p.prefill;
  const StagePlan& b = p.decode;
  const auto row = [](std::string_view name, const std::string& x, const std::string& y) {
    fmt::print("  {:<34} {:>12} {:>12}\n", name, x, y);
  };
  const auto both = [&](std::string_view name, auto field) { row(name, field(a), field(b)); };
  fmt::print("\none step, per device                  {:>12} {:>12}\n", "prefill", "decode");
  both("tokens (deployment)", [](const StagePlan& s) { return fmt::format("{}", s.tokens); });
  both("mean rows per expert (T*k/E)",
       [](const StagePlan& s) { return fmt::format("{:.2f}", s.mean_rows_per_expert); });
  both("experts touched per layer",
       [](const StagePlan& s) { return fmt::format("{:.1f}", s.distinct_experts_per_layer); });
  both("  of them on this device",
       [](const StagePlan& s) { return fmt::format("{:.1f}", s.distinct_experts_per_device); });
  both("TFLOP attention projections",
       [](const StagePlan& s) { return tflop(s.flops.attention_projections); });
  both("TFLOP experts (routed, shared)",
       [](const StagePlan& s) { return tflop(s.flops.routed_experts + s.flops.shared_experts); });
  both("TFLOP router, dense FFNs, head", [](const StagePlan& s) {
    return tflop(s.flops.router + s.flops.dense_ffn + s.flops.lm_head);
  });
  both("TFLOP attention over context",
       [](const StagePlan& s) { return tflop(s.flops.attention_context); });
  both("GB weights read", [](const StagePlan& s) { return gb(s.weight_read_bytes); });
  both("GB KV cache read and written", [](const StagePlan& s) { return gb(s.kv_cache_bytes); });
  both("MB dispatch+combine per MoE layer", [](const StagePlan& s) {
    return mb(s.dispatch.upper_bound_bytes + s.combine.upper_bound_bytes);
  });
  both("  expected, same node", [](const StagePlan& s) {
    return mb(s.dispatch.same_node_bytes + s.combine.same_node_bytes);
  });
  both("  expected, cross node", [](const StagePlan& s) {
    return mb(s.dispatch.cross_node_bytes + s.combine.cross_node_bytes);
  });
  both("  one copy per device (DeepEP)", [](const StagePlan& s) {
    return mb(s.dispatch.one_copy_per_device_bytes + s.combine.one_copy_per_device_bytes);
  });
  both("GB sent: dispatch and combine", [](const StagePlan& s) { return gb(s.dispatch_bytes); });
  both("GB sent: all-reduces", [](const StagePlan& s) { return gb(s.collective_bytes); });
  both("ms memory", [](const StagePlan& s) { return ms(s.memory_s); });
  both("ms compute", [](const StagePlan& s) { return ms(s.compute_s); });
  both("ms dispatch and combine", [](const StagePlan& s) { return ms(s.dispatch_s); });
  both("ms all-reduces", [](const StagePlan& s) { return ms(s.collectives_s); });
  both("ms floor of the step", [](const StagePlan& s) { return ms(s.bound_s); });
  both("bottleneck", [](const StagePlan& s) { return std::string(bottleneck_name(s.bottleneck)); });
  both("tokens/s at the floor", [](const StagePlan& s) {
    return fmt::format("{:.0f}", static_cast<double>(s.tokens) / s.bound_s);
  });
  fmt::print(
      "\nDispatch rows sum both directions over the deployment: the bound T*k*H*b counts "
      "every pair,\nthe expected bytes leave out the {:.1f}% whose expert is on the "
      "token's own device. Floors\nassume uniform routing, perfect overlap and peak "
      "rates; decode dispatch is latency-bound in practice.\n",
      100 * p.local_fraction);
}

nlohmann::json traffic_json(const ExpertTraffic& t) {
  return {{"upper_bound_bytes", t.upper_bound_bytes},
          {"expected_bytes", t.expected_bytes},
          {"same_node_bytes", t.same_node_bytes},
          {"cross_node_bytes", t.cross_node_bytes},
          {"one_copy_per_device_bytes", t.one_copy_per_device_bytes}};
}

nlohmann::json stage_json(const StagePlan& s) {
  const StepFlops& f = s.flops;
  return {{"tokens", s.tokens},
          {"tokens_per_group", s.tokens_per_group},
          {"mean_rows_per_expert", s.mean_rows_per_expert},
          {"distinct_experts_per_layer", s.distinct_experts_per_layer},
          {"distinct_experts_per_device", s.distinct_experts_per_device},
          {"dispatch_per_moe_layer", traffic_json(s.dispatch)},
          {"combine_per_moe_layer", traffic_json(s.combine)},
          {"flops",
           {{"attention_projections", f.attention_projections},
            {"dense_ffn", f.dense_ffn},
            {"shared_experts", f.shared_experts},
            {"routed_experts", f.routed_experts},
            {"router", f.router},
            {"lm_head", f.lm_head},
            {"matrices", f.matrices()},
            {"attention_context", f.attention_context}}},
          {"bytes",
           {{"weights_read", s.weight_read_bytes},
            {"kv_cache", s.kv_cache_bytes},
            {"dispatch_sent", s.dispatch_bytes},
            {"collectives_sent", s.collective_bytes}}},
          {"seconds",
           {{"memory", s.memory_s},
            {"compute", s.compute_s},
            {"dispatch", s.dispatch_s},
            {"collectives", s.collectives_s},
            {"bound", s.bound_s}}},
          {"bottleneck", bottleneck_name(s.bottleneck)},
          {"tokens_per_s", static_cast<double>(s.tokens) / s.bound_s}};
}

nlohmann::json memory_json(const MemoryPlan& m) {
  const WeightBytes& w = m.resident;
  return {{"model_weight_bytes", m.model_weight_bytes},
          {"active_weight_bytes_per_token", m.active_weight_bytes_per_token},
          {"resident_weight_bytes",
           {{"attention", w.attention},
            {"embedding", w.embedding},
            {"dense_ffn", w.dense_ffn},
            {"shared_experts", w.shared_experts},
            {"routed_experts", w.routed_experts},
            {"router", w.router},
            {"norms", w.norms},
            {"total", w.total()}}},
          {"active_weight_bytes_per_token_per_device", m.active_weight_bytes_per_token_per_device},
          {"capacity_bytes", m.capacity_bytes},
          {"reserve_bytes", m.reserve_bytes},
          {"kv_budget_bytes", m.kv_budget_bytes},
          {"kv_bytes_per_token", m.kv_bytes_per_token},
          {"kv_tokens_per_group", m.kv_tokens_per_group},
          {"requested_tokens_per_group", m.requested_tokens_per_group},
          {"max_concurrency", m.max_concurrency},
          {"fits", m.fit == Fit::kFits},
          {"fit", fit_name(m.fit)},
          {"reason", m.reason}};
}

}  // namespace

void print_plan_table(const Plan& plan) {
  print_header(plan);
  print_memory(plan);
  print_stages(plan);
}

nlohmann::json plan_json(const Plan& p) {
  const Hardware& hw = p.hardware;
  const DeploymentSpec& s = p.spec;
  return {{"model", p.model},
          {"hardware",
           {{"name", hw.name},
            {"description", hw.description},
            {"memory_bytes", hw.memory_bytes},
            {"memory_bytes_per_s", hw.memory_bytes_per_s},
            {"peak_flops_16bit", hw.peak_flops_16bit},
            {"peak_flops_fp8", hw.peak_flops_fp8},
            {"link_bytes_per_s", hw.link_bytes_per_s},
            {"network_bytes_per_s", hw.network_bytes_per_s},
            {"devices_per_node", hw.devices_per_node}}},
          {"layout",
           {{"tp", s.tp},
            {"dp", s.dp},
            {"expert_parallel", s.expert_parallel},
            {"ep", p.ep},
            {"num_devices", p.num_devices},
            {"num_nodes", p.num_nodes},
            {"devices_per_node", p.devices_per_node},
            {"experts_per_device", p.experts_per_device},
            {"local_fraction", p.local_fraction},
            {"same_node_fraction", p.same_node_fraction},
            {"cross_node_fraction", p.cross_node_fraction}}},
          {"load",
           {{"weights", storage_format_name(s.weights)},
            {"kv_cache", storage_format_name(s.kv_cache)},
            {"dispatch", storage_format_name(s.dispatch)},
            {"context_len", s.context_len},
            {"concurrency", s.concurrency},
            {"prefill_tokens", s.prefill_tokens},
            {"decode_tokens", s.decode_tokens}}},
          {"memory", memory_json(p.memory)},
          {"prefill", stage_json(p.prefill)},
          {"decode", stage_json(p.decode)}};
}

}  // namespace moe::cli
