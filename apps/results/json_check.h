// Checks of the JSON files this project writes (results, evaluation results): that a field exists and has
// the expected type, with an error naming the field's full path.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace tt {

enum class JsonKind { kNumber, kNumberOrNull, kString, kObject, kArray, kInteger, kBool };

// Walks the dotted `path` ("summary.step_ms.median") from `root`; throws std::runtime_error
// "<what>: field "<prefix>.<path>" is missing" or "... has the wrong type: <value>".
void expect_field(const nlohmann::json& root, const std::string& path, JsonKind kind,
                  const std::string& what = "result JSON", const std::string& prefix = "");

}  // namespace tt
