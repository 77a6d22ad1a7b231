// Training configs: any bytes (a TOML text, then `--set` values, each after a 0x01 byte)
// either read into a config or throw fp8lab::Error; a config read writes out as TOML that
// reads back to the same config.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fp8lab/core/error.hpp"
#include "fp8lab/settings/config.hpp"

using namespace fp8lab::settings;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> parts;
  for (std::size_t start = 0;;) {
    const std::size_t sep = input.find('\x01', start);
    parts.push_back(input.substr(start, sep == std::string::npos ? std::string::npos : sep - start));
    if (sep == std::string::npos) break;
    start = sep + 1;
  }
  const std::vector<std::string> overrides(parts.begin() + 1, parts.end());
  TrainConfig c;
  try {
    c = read_train_config(parts[0], "fuzz.toml", overrides);
  } catch (const fp8lab::Error&) {
    return 0;
  }
  const TrainConfig back = read_train_config(to_toml(c), "to_toml", {}, true);  // must not throw
  if (to_json(back) != to_json(c)) __builtin_trap();
  return 0;
}
