// fp8lab snr: measured and model SNR of formats on a sampled distribution (Appendix A, B).
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "commands.hpp"
#include "fp8lab/core/analysis.hpp"
#include "fp8lab/core/format.hpp"
#include "table.hpp"

namespace fp8lab::cli {

namespace {
struct SnrArgs {
  std::vector<std::string> formats;
  std::string dist = "normal";
  double scale = 1.0;
  double span = 16;
  std::int64_t samples = 1000000;
  std::uint64_t seed = 1;
  bool csv = false;
};

void run_snr(const SnrArgs& a) {
  DistSpec d;
  d.dist = parse_distribution(a.dist);
  if (!(a.scale > 0) || !std::isfinite(a.scale)) throw Error("--scale must be a positive number");
  if (!(a.span > 0)) throw Error("--span must be a positive number of octaves");
  constexpr std::int64_t kMaxSamples = std::int64_t{1} << 30;  // 4 GiB of float32 samples
  if (a.samples < 1 || a.samples > kMaxSamples)
    throw Error("--samples must be in 1.." + std::to_string(kMaxSamples) + " (got " + std::to_string(a.samples) + ")");
  d.scale = a.scale;
  d.log2_span = a.span;
  std::vector<Format> fs;
  for (const auto& n : a.formats) fs.push_back(parse_format(n));  // all errors before work
  const std::vector<float> x = sample(d, static_cast<std::size_t>(a.samples), a.seed);
  Table t({"name", "format", "dist", "scale", "samples", "measured_snr_db", "model_snr_db",
           "model", "dynamic_range_db"});
  for (std::size_t i = 0; i < fs.size(); ++i) {
    const Format& f = fs[i];
    const double model = snr_model_db(f, d);
    t.add({a.formats[i], to_string(f), std::string(to_string(d.dist)), fmt_g(d.scale),
           std::to_string(a.samples), fmt_f(measured_snr_db(f, x), 2),
           std::isnan(model) ? "" : fmt_f(model, 2),
           f.exp_bits == 0 ? (std::isnan(model) ? "none" : "fixed-point (App. A)")
                           : "7.44+6.02p (App. B)",
           fmt_f(dynamic_range_db(f))});
  }
  t.print(a.csv);
}
}  // namespace

void register_snr(CLI::App& app) {
  auto args = std::make_shared<SnrArgs>();
  auto* cmd = app.add_subcommand("snr", "Measured and model SNR of formats on a distribution");
  cmd->add_option("formats", args->formats, "Formats to measure")->required();
  cmd->add_option("--dist", args->dist, "normal, uniform, laplace or loguniform")
      ->capture_default_str();
  cmd->add_option("--scale", args->scale,
                  "normal: sigma; uniform: half-width; laplace: b; loguniform: max |x|")
      ->capture_default_str();
  cmd->add_option("--span", args->span, "loguniform: octaves below --scale")->capture_default_str();
  cmd->add_option("--samples", args->samples, "Number of samples")->capture_default_str();
  cmd->add_option("--seed", args->seed, "Sampling seed")->capture_default_str();
  cmd->add_flag("--csv", args->csv, "Print CSV with a header row");
  cmd->callback([args] { run_snr(*args); });
}

}  // namespace fp8lab::cli
