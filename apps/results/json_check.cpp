#include "apps/results/json_check.h"

#include <stdexcept>

namespace tt {

void expect_field(const nlohmann::json& root, const std::string& path, JsonKind kind, const std::string& what,
                  const std::string& prefix) {
  const std::string full = prefix.empty() ? path : prefix + "." + path;
  const nlohmann::json* node = &root;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string key = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (!node->is_object() || !node->contains(key)) throw std::runtime_error(what + ": field \"" + full + "\" is missing");
    node = &(*node)[key];
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  bool ok = false;
  switch (kind) {
    case JsonKind::kNumber: ok = node->is_number(); break;
    case JsonKind::kNumberOrNull: ok = node->is_number() || node->is_null(); break;
    case JsonKind::kString: ok = node->is_string(); break;
    case JsonKind::kObject: ok = node->is_object(); break;
    case JsonKind::kArray: ok = node->is_array(); break;
    case JsonKind::kInteger: ok = node->is_number_integer(); break;
    case JsonKind::kBool: ok = node->is_boolean(); break;
  }
  if (!ok) throw std::runtime_error(what + ": field \"" + full + "\" has the wrong type: " + node->dump());
}

}  // namespace tt
