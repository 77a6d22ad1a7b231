#include "fp8lab/settings/compute_spec.hpp"

#include <algorithm>
#include <exception>
#include <string>
#include <utility>

#include "fp8lab/core/enum_names.hpp"

namespace fp8lab::nn {

namespace {

constexpr EnumName<Compute> kNames[] = {
    {Compute::auto_, "auto"}, {Compute::fp32, "fp32"}, {Compute::bf16, "bf16"}};

}  // namespace

std::string_view to_string(Compute c) { return enum_name(kNames, c); }

Compute parse_compute(std::string_view s) { return enum_parse(kNames, s, "compute path"); }

std::string to_string(const Accumulation& a) {
  if (a.model) return fp8lab::to_string(*a.model);
  return a.chunked() ? to_string(a.partial) + "@" + std::to_string(a.chunk) : "fp32";
}

namespace {
bool names_dot_model(std::string_view s) {
  if (s.substr(0, 4) == "dot:") return true;
  const auto& presets = dot_presets();
  return std::any_of(presets.begin(), presets.end(), [&](const DotPreset& p) { return p.name == s; });
}
}  // namespace

Accumulation parse_accumulation(std::string_view s) {
  if (s == "fp32") return {};
  if (names_dot_model(s)) {
    Accumulation a;
    try {
      a.model = parse_dot_model(s);
    } catch (const Error& e) {
      throw Error("accumulation '" + std::string(s) + "': " + e.what());
    }
    return a;
  }
  const std::size_t at = s.rfind('@');
  if (at == std::string_view::npos) {
    std::string presets;
    for (const auto& p : dot_presets()) presets += ", " + std::string(p.name);
    throw Error("accumulation '" + std::string(s) + "': expected fp32, FORMAT@CHUNK (e.g. 1.8.10@128), a dot model" +
                presets + " or dot:KEY=VALUE:...");
  }
  Accumulation a;
  const std::string chunk(s.substr(at + 1));
  if (chunk.empty() || chunk.find_first_not_of("0123456789") != std::string::npos || chunk.find_first_not_of('0') == std::string::npos)
    throw Error("accumulation '" + std::string(s) + "': chunk '" + chunk + "' is not a positive integer");
  constexpr std::int64_t kMaxChunk = std::int64_t{1} << 24;  // longer than any product's sum
  const std::size_t digits = chunk.size() - std::min(chunk.find_first_not_of('0'), chunk.size());
  a.chunk = digits > 9 ? kMaxChunk + 1 : std::stoll(chunk);
  if (a.chunk > kMaxChunk)
    throw Error("accumulation '" + std::string(s) + "': chunk " + chunk + " is out of range 1.." + std::to_string(kMaxChunk));
  try {
    a.partial = parse_format(s.substr(0, at));
  } catch (const Error& e) {
    throw Error("accumulation '" + std::string(s) + "': " + e.what());
  }
  return a;
}

}  // namespace fp8lab::nn
