#include "core/json_fields.h"

#include <cmath>
#include <limits>

#include "moe/error.h"

namespace moe {

std::string describe_json(const nlohmann::json& value) {
  // Long values (a whole object pasted where a number belongs) are cut so the message stays
  // one readable line.
  constexpr size_t kMaxShown = 40;
  if (value.is_null()) return "null";
  std::string text = value.dump();
  if (text.size() > kMaxShown) text = text.substr(0, kMaxShown) + "...";
  return fmt::format("{} {}", value.type_name(), text);
}

JsonFields::JsonFields(const nlohmann::json& object, std::string_view source, std::string_view path)
    : object_(object), source_(source), path_(path) {}

void JsonFields::fail_field(std::string_view field, std::string_view expected,
                            const std::string& given) const {
  fail("{}: field \"{}{}\": expected {}; got {}", source_, path_, field, expected, given);
}

const nlohmann::json* JsonFields::find(std::string_view field) const {
  const auto it = object_.find(std::string(field));
  if (it == object_.end() || it->is_null()) return nullptr;
  return &*it;
}

bool JsonFields::has(std::string_view field) const { return find(field) != nullptr; }

const nlohmann::json& JsonFields::require(std::string_view field, std::string_view expected) const {
  const nlohmann::json* value = find(field);
  if (value == nullptr) {
    fail("{}: missing required field \"{}{}\" (expected {})", source_, path_, field, expected);
  }
  return *value;
}

int64_t JsonFields::as_integer(std::string_view field, const nlohmann::json& value,
                               std::string_view expected) const {
  if (value.is_number_unsigned()) {
    const uint64_t unsigned_value = value.get<uint64_t>();
    if (unsigned_value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      fail_field(field, fmt::format("{} that fits in int64", expected), describe_json(value));
    }
    return static_cast<int64_t>(unsigned_value);
  }
  if (value.is_number_integer()) return value.get<int64_t>();
  fail_field(field, expected, describe_json(value));
}

int64_t JsonFields::integer(std::string_view field) const {
  return as_integer(field, require(field, "an integer"), "an integer");
}

int64_t JsonFields::integer_or(std::string_view field, int64_t fallback) const {
  const nlohmann::json* value = find(field);
  return value ? as_integer(field, *value, "an integer") : fallback;
}

int64_t JsonFields::positive(std::string_view field) const {
  constexpr std::string_view kExpected = "a positive integer";
  const int64_t value = as_integer(field, require(field, kExpected), kExpected);
  if (value <= 0) fail_field(field, kExpected, std::to_string(value));
  return value;
}

int64_t JsonFields::positive_or(std::string_view field, int64_t fallback) const {
  if (!has(field)) return fallback;
  return positive(field);
}

int64_t JsonFields::non_negative_or(std::string_view field, int64_t fallback) const {
  const int64_t value = integer_or(field, fallback);
  if (value < 0) fail_field(field, "an integer >= 0", std::to_string(value));
  return value;
}

double JsonFields::number_or(std::string_view field, double fallback) const {
  const nlohmann::json* value = find(field);
  if (value == nullptr) return fallback;
  if (!value->is_number()) fail_field(field, "a number", describe_json(*value));
  const double number = value->get<double>();
  if (!std::isfinite(number)) fail_field(field, "a finite number", describe_json(*value));
  return number;
}

bool JsonFields::boolean_or(std::string_view field, bool fallback) const {
  const nlohmann::json* value = find(field);
  if (value == nullptr) return fallback;
  if (!value->is_boolean()) fail_field(field, "true or false", describe_json(*value));
  return value->get<bool>();
}

std::string JsonFields::as_string(std::string_view field, const nlohmann::json& value) const {
  if (!value.is_string()) fail_field(field, "a string", describe_json(value));
  return value.get<std::string>();
}

std::string JsonFields::string(std::string_view field) const {
  return as_string(field, require(field, "a string"));
}

std::string JsonFields::string_or(std::string_view field, std::string_view fallback) const {
  const nlohmann::json* value = find(field);
  return value ? as_string(field, *value) : std::string(fallback);
}

std::vector<int64_t> JsonFields::as_integer_list(std::string_view field,
                                                 const nlohmann::json& value) const {
  if (!value.is_array()) fail_field(field, "a list of integers", describe_json(value));
  std::vector<int64_t> list;
  list.reserve(value.size());
  for (const nlohmann::json& element : value) {
    list.push_back(as_integer(field, element, "a list of integers"));
  }
  return list;
}

std::vector<int64_t> JsonFields::integer_list(std::string_view field) const {
  return as_integer_list(field, require(field, "a list of integers"));
}

std::vector<int64_t> JsonFields::integer_list_or_empty(std::string_view field) const {
  const nlohmann::json* value = find(field);
  return value ? as_integer_list(field, *value) : std::vector<int64_t>{};
}

}  // namespace moe
