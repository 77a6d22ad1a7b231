// Recipe TOML files: any bytes either parse into a recipe or throw fp8lab::Error.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fp8lab/core/error.hpp"
#include "fp8lab/settings/recipe.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    (void)fp8lab::nn::parse_recipe_toml(std::string(reinterpret_cast<const char*>(data), size), "fuzz.toml");
  } catch (const fp8lab::Error&) {
  }
  return 0;
}
