// One side of a parallel text: any bytes either split into non-empty UTF-8 lines that
// join back to the input (less the CR of CRLF and a CR that ends the input) or throw
// fp8lab::Error.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fp8lab/core/error.hpp"
#include "fp8lab/core/text.hpp"
#include "fp8lab/data/bitext.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  try {
    const auto lines = fp8lab::data::parse_lines(input, "fuzz.en");
    std::string joined;
    for (const auto& l : lines) {
      if (l.empty() || !fp8lab::valid_utf8(l)) __builtin_trap();
      joined += l + "\n";
    }
    std::string expected;
    for (std::size_t i = 0; i < input.size(); ++i)
      if (!(input[i] == '\r' && (i + 1 == input.size() || input[i + 1] == '\n'))) expected += input[i];
    if (!expected.empty() && expected.back() != '\n') expected += '\n';
    if (joined != expected) __builtin_trap();
  } catch (const fp8lab::Error&) {
  }
  return 0;
}
