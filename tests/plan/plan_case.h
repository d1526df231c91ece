// Helpers shared by the planner tests.
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include <gtest/gtest.h>

#include "moe/config.h"
#include "moe/error.h"
#include "moe/hardware.h"
#include "moe/plan.h"

namespace moe {

// The message of the moe::Error `action` throws, or "" (and a test failure) when it throws none.
inline std::string error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const Error& error) {
    return error.what();
  }
  ADD_FAILURE() << "expected a moe::Error";
  return "";
}

inline Plan plan_of(std::string_view model, std::string_view hardware, const DeploymentSpec& spec) {
  return plan_deployment(preset_config(model), hardware_preset(hardware), spec);
}

inline DeploymentSpec layout(int64_t tp, int64_t dp, bool expert_parallel) {
  DeploymentSpec spec;
  spec.tp = tp;
  spec.dp = dp;
  spec.expert_parallel = expert_parallel;
  return spec;
}

}  // namespace moe
