// fp8lab values: every code of a format with its bit fields, value and class.
#include <memory>
#include <string>

#include "commands.hpp"
#include "fp8lab/core/codec.hpp"
#include "fp8lab/core/format.hpp"
#include "table.hpp"

namespace fp8lab::cli {

namespace {
struct ValuesArgs {
  std::string format;
  bool csv = false;
};

std::string_view class_name(Format::Class c) {
  switch (c) {
    case Format::Class::zero: return "zero";
    case Format::Class::subnormal: return "subnormal";
    case Format::Class::normal: return "normal";
    case Format::Class::nan: return "NaN";
    case Format::Class::inf: return "Inf";
  }
  return "?";
}

void run_values(const ValuesArgs& a) {
  const Format f = parse_format(a.format);
  require_codable(f);
  const int W = f.width(), E = f.exp_bits, M = f.man_bits;
  const int hex_digits = (W + 3) / 4;
  Table t({"code", "sign", "exponent", "mantissa", "value", "class"});
  for (std::uint32_t c = 0; c < (1u << W); ++c) {
    char hex[80];  // roomy enough for any width the compiler can imagine
    std::snprintf(hex, sizeof hex, "0x%0*x", hex_digits, c);
    auto bits = [&](std::uint32_t v, int n) {
      std::string s;
      for (int i = n - 1; i >= 0; --i) s += ((v >> i) & 1) ? '1' : '0';
      return s.empty() ? std::string("-") : s;
    };
    const std::uint32_t mag = c & f.mag_mask();
    t.add({hex, f.sign ? std::to_string(c >> (W - 1)) : std::string("-"), bits(mag >> M, E), bits(mag & ((1u << M) - 1), M),
           fmt_g(decode(c, f), 9), std::string(class_name(f.classify(c)))});
  }
  if (!a.csv) {
    const std::string_view preset = preset_name(f);
    std::printf("%s%s%s: %d bits%s, bias %d, policy %s, subnormals %s%s; %llu finite values\n",
                to_string(f).c_str(), preset.empty() ? "" : " = ", std::string(preset).c_str(), W,
                f.sign ? "" : " (unsigned)", f.bias, std::string(to_string(f.policy)).c_str(),
                f.subnormals ? "on" : "off", f.zero ? "" : ", no zero (code 0 is 2^-bias)",
                static_cast<unsigned long long>(f.finite_count()));
  }
  t.print(a.csv);
}
}  // namespace

void register_values(CLI::App& app) {
  auto args = std::make_shared<ValuesArgs>();
  auto* cmd = app.add_subcommand("values", "List every code of a format");
  cmd->add_option("format", args->format, "Format, e.g. 1.4.3:10 or e4m3fn")->required();
  cmd->add_flag("--csv", args->csv, "Print CSV with a header row");
  cmd->callback([args] { run_values(*args); });
}

}  // namespace fp8lab::cli
