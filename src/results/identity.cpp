// A stored config's identity (store.hpp): nlohmann/json only, so that the sweep file's parser
// and its fuzz target use it without SQLite.
#include <nlohmann/json.hpp>

#include "fp8lab/results/store.hpp"

namespace fp8lab::results {

std::string config_identity(const std::string& config_json) {
  nlohmann::json j = nlohmann::json::parse(config_json, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return config_json;
  j.erase("threads");
  if (j.contains("train") && j["train"].is_object()) j["train"].erase("checkpoint");
  return j.dump();
}

}  // namespace fp8lab::results
