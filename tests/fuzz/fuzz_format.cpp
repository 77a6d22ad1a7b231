// The mini-languages: format strings, scaled format strings, one-line recipes, loss scaling
// and accumulation (docs/spec.md §1, §4.2, §5, §6, §7.3): any text either parses or throws
// fp8lab::Error; a parsed format (fixed-bias or scaled), loss scaling or accumulation
// prints and parses back to itself.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fp8lab/core/format.hpp"
#include "fp8lab/core/scaled.hpp"
#include "fp8lab/settings/compute_spec.hpp"
#include "fp8lab/settings/loss_scale_spec.hpp"
#include "fp8lab/settings/recipe.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const fp8lab::Format f = fp8lab::parse_format(text);
    if (!(fp8lab::parse_format(fp8lab::to_string(f)) == f)) __builtin_trap();
  } catch (const fp8lab::Error&) {
  }
  try {
    const fp8lab::ScaledSpec s = fp8lab::parse_scaled(text);
    if (!(fp8lab::parse_scaled(fp8lab::to_string(s)) == s)) __builtin_trap();
  } catch (const fp8lab::Error&) {
  }
  try {
    (void)fp8lab::parse_rounding(text);
  } catch (const fp8lab::Error&) {
  }
  try {
    (void)fp8lab::nn::parse_kind_quant(text);
  } catch (const fp8lab::Error&) {
  }
  try {
    (void)fp8lab::nn::parse_recipe(text);
  } catch (const fp8lab::Error&) {
  }
  try {
    const fp8lab::nn::LossScaleConfig c = fp8lab::nn::parse_loss_scale(text);
    if (!(fp8lab::nn::parse_loss_scale(fp8lab::nn::to_string(c)) == c)) __builtin_trap();
  } catch (const fp8lab::Error&) {
  }
  try {
    const fp8lab::nn::Accumulation a = fp8lab::nn::parse_accumulation(text);
    if (!(fp8lab::nn::parse_accumulation(fp8lab::nn::to_string(a)) == a)) __builtin_trap();
  } catch (const fp8lab::Error&) {
  }
  return 0;
}
