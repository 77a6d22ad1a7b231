// fp8lab formats: dynamic range and SNR of formats (the paper's Table 1).
#include <memory>
#include <string>
#include <vector>

#include "commands.hpp"
#include "fp8lab/core/analysis.hpp"
#include "fp8lab/core/format.hpp"
#include "table.hpp"

namespace fp8lab::cli {

namespace {
struct FormatsArgs {
  std::vector<std::string> formats;
  bool csv = false;
  bool presets = false;
};

void run_formats(const FormatsArgs& a) {
  std::vector<std::string> names = a.formats;
  if (a.presets)
    for (const auto& p : presets()) names.emplace_back(p.name);
  if (names.empty()) names.assign(table1_format_names().begin(), table1_format_names().end());
  Table t({"name", "format", "E", "M", "bias", "policy", "subnormals", "max", "min_normal",
           "min_positive", "dynamic_range_db", "snr_db"});
  for (const auto& n : names) {
    const Format f = parse_format(n);
    t.add({n, to_string(f), std::to_string(f.exp_bits), std::to_string(f.man_bits),
           std::to_string(f.bias), std::string(to_string(f.policy)), f.subnormals ? "yes" : "no",
           fmt_g(f.max_finite(), 8), fmt_g(f.min_normal(), 8), fmt_g(f.min_positive(), 8),
           fmt_f(dynamic_range_db(f)), fmt_f(float_snr_model_db(f))});
  }
  t.print(a.csv);
}
}  // namespace

void register_formats(CLI::App& app) {
  auto args = std::make_shared<FormatsArgs>();
  auto* cmd = app.add_subcommand(
      "formats", "Dynamic range and SNR of formats (the paper's Table 1 by default)");
  cmd->add_option("formats", args->formats,
                  "Formats: 1.E.M or 0.E.M (unsigned)[:bias][:policy][:nosub][:nozero] or presets (e4m3fn, e8m0, ...)");
  cmd->add_flag("--csv", args->csv, "Print CSV with a header row");
  cmd->add_flag("--presets", args->presets, "Add every named preset");
  cmd->callback([args] { run_formats(*args); });
}

}  // namespace fp8lab::cli
