// SWORD imp exports and their OSIS markup (the Bible corpus builder's input): any text
// either parses or throws fp8lab::Error.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fp8lab/core/error.hpp"
#include "fp8lab/data/bitext.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    for (const auto& e : fp8lab::data::parse_imp(text, "fuzz.imp")) {
      (void)fp8lab::data::strip_osis(e.raw);
      (void)fp8lab::data::strongs_numbers(e.raw);
    }
  } catch (const fp8lab::Error&) {
  }
  (void)fp8lab::data::strip_osis(text);
  return 0;
}
