// The two faces of a moe::Plan: a table for people and one JSON object for programs.
#pragma once

#include <nlohmann/json.hpp>

#include "moe/plan.h"

namespace moe::cli {

void print_plan_table(const Plan& plan);
nlohmann::json plan_json(const Plan& plan);

}  // namespace moe::cli
