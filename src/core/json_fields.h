// Typed reads of the fields of one JSON object (a config.json), each failing with a moe::Error
// that names the file, the field, what was expected and what was given. A field set to null
// counts as absent, as Hugging Face writes optional fields that way ("q_lora_rank": null).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace moe {

class JsonFields {
 public:
  // `object` must outlive the reader; `source` names the file in messages and `path` where the
  // object sits in it ("text_config."), prefixed to field names.
  JsonFields(const nlohmann::json& object, std::string_view source, std::string_view path = "");

  bool has(std::string_view field) const;

  int64_t integer(std::string_view field) const;
  int64_t integer_or(std::string_view field, int64_t fallback) const;
  // Integers that are sizes or counts: > 0, or >= 0 for non_negative_or.
  int64_t positive(std::string_view field) const;
  int64_t positive_or(std::string_view field, int64_t fallback) const;
  int64_t non_negative_or(std::string_view field, int64_t fallback) const;

  double number_or(std::string_view field, double fallback) const;
  bool boolean_or(std::string_view field, bool fallback) const;
  std::string string(std::string_view field) const;
  std::string string_or(std::string_view field, std::string_view fallback) const;
  std::vector<int64_t> integer_list(std::string_view field) const;
  std::vector<int64_t> integer_list_or_empty(std::string_view field) const;

  // The error every check on this object's fields raises; public so that callers checking a
  // relation between fields word it the same way.
  [[noreturn]] void fail_field(std::string_view field, std::string_view expected,
                               const std::string& given) const;

 private:
  const nlohmann::json* find(std::string_view field) const;  // nullptr when absent or null
  const nlohmann::json& require(std::string_view field, std::string_view expected) const;
  int64_t as_integer(std::string_view field, const nlohmann::json& value,
                     std::string_view expected) const;
  std::string as_string(std::string_view field, const nlohmann::json& value) const;
  std::vector<int64_t> as_integer_list(std::string_view field, const nlohmann::json& value) const;

  const nlohmann::json& object_;
  std::string source_;
  std::string path_;
};

// A short rendering of a JSON value for messages: its type, and the value when it is short.
std::string describe_json(const nlohmann::json& value);

}  // namespace moe
