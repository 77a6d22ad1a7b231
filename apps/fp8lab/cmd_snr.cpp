// fp8lab snr: measured and model SNR of formats on a sampled distribution (Appendix A, B),
// and of scaled formats (docs/spec.md §6), optionally as the block size varies.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "commands.hpp"
#include "fp8lab/core/analysis.hpp"
#include "fp8lab/core/format.hpp"
#include "fp8lab/core/scaled.hpp"
#include "fp8lab/results/plot.hpp"
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
  std::int64_t row = 4096;
  std::string blocks;
  std::string plot;
  bool csv = false;
};

// One block size of --blocks: K, or 0 for one scale per tensor.
std::vector<int> parse_blocks(const std::string& text) {
  std::vector<int> out;
  std::size_t start = 0;
  for (;;) {
    const std::size_t at = text.find(',', start);
    const std::string item(trim(std::string_view(text).substr(start, at == std::string::npos ? std::string::npos : at - start)));
    if (item == "tensor") {
      out.push_back(0);
    } else {
      char* end = nullptr;
      const long k = item.empty() ? 0 : std::strtol(item.c_str(), &end, 10);
      if (item.empty() || end != item.c_str() + item.size() || k < 1 || k > kMaxBlock)
        throw Error("--blocks: '" + item + "' is neither a block size in 1.." + std::to_string(kMaxBlock) +
                    " nor 'tensor'");
      out.push_back(static_cast<int>(k));
    }
    if (at == std::string::npos) return out;
    start = at + 1;
  }
}

// The quantizer `s` with groups of k (1xK blocks; KxK tiles stay tiles; 0: per tensor). A
// fixed-bias format gets E8M0 scales with the OCP rule.
ScaledSpec with_block(ScaledSpec s, int k) {
  if (!s.scaled()) s.scale = ScaleFormat::e8m0;
  s.history = 0;
  if (k == 0) {
    s.granularity = Granularity::tensor;
    s.block = 0;
  } else {
    if (s.granularity != Granularity::tile) s.granularity = Granularity::block;
    s.block = k;
  }
  validate(s);
  return s;
}

std::string block_label(int k) { return k == 0 ? "tensor" : std::to_string(k); }

void plot_blocks(const std::string& stem, const std::vector<std::string>& names, const std::vector<int>& blocks,
                 const std::vector<std::vector<double>>& snr, const DistSpec& d) {
  results::plot::Panel p;
  p.title = "Measured SNR against the block size, " + to_string(d);
  p.xlabel = "values per scale (log2)";
  p.ylabel = "SNR (dB)";
  for (std::size_t f = 0; f < names.size(); ++f) {
    results::plot::Series s;
    s.label = names[f];
    s.color = static_cast<int>(f);
    for (std::size_t b = 0; b < blocks.size(); ++b)
      if (blocks[b] > 0) {
        s.x.push_back(std::log2(blocks[b]));
        s.y.push_back(snr[f][b]);
      }
    p.series.push_back(s);
    for (std::size_t b = 0; b < blocks.size(); ++b)
      if (blocks[b] == 0) p.lines.push_back({snr[f][b], names[f] + " per tensor", static_cast<int>(f)});
  }
  results::plot::Figure fig;
  fig.title = "What block scaling buys";
  fig.panels.push_back(std::move(p));
  fig.panel_width = 720;
  fig.panel_height = 420;
  results::plot::save(fig, stem);
}

void run_snr(const SnrArgs& a) {
  DistSpec d = parse_dist_spec(a.dist);
  if (!(a.scale > 0) || !std::isfinite(a.scale)) throw Error("--scale must be a positive number");
  if (!(a.span > 0)) throw Error("--span must be a positive number of octaves");
  if (a.samples < 1 || a.samples > static_cast<std::int64_t>(kMaxSamples))
    throw Error("--samples must be in 1.." + std::to_string(kMaxSamples) + " (got " + std::to_string(a.samples) + ")");
  if (a.row < 1 || a.row > kMaxSamples) throw Error("--row must be a positive number of values");
  if (!a.plot.empty() && a.blocks.empty()) throw Error("--plot draws the --blocks sweep: give --blocks too");
  d.scale = a.scale;
  d.log2_span = a.span;
  std::vector<ScaledSpec> specs;
  for (const auto& n : a.formats) specs.push_back(parse_scaled(n));  // all errors before work
  const std::vector<int> blocks = a.blocks.empty() ? std::vector<int>{} : parse_blocks(a.blocks);
  bool any_scaled = !blocks.empty();
  for (const auto& s : specs) any_scaled = any_scaled || s.scaled();
  std::vector<float> x = sample(d, static_cast<std::size_t>(a.samples), a.seed);
  // Scaled formats see the samples as rows of --row values (whole rows only).
  const std::size_t cols = std::min<std::size_t>(static_cast<std::size_t>(a.row), x.size());
  if (any_scaled) x.resize(x.size() / cols * cols);
  const std::string n_samples = std::to_string(x.size());

  if (!blocks.empty()) {
    Table t({"name", "block", "quantizer", "dist", "samples", "bits_per_value", "measured_snr_db"});
    std::vector<std::vector<double>> snr(specs.size());
    for (std::size_t i = 0; i < specs.size(); ++i)
      for (int k : blocks) {
        const ScaledSpec s = with_block(specs[i], k);
        snr[i].push_back(measured_snr_db(s, x, cols));
        t.add({a.formats[i], block_label(k), to_string(s), to_string(d), n_samples,
               fmt_f(bits_per_element(s, x.size() / cols, cols), 3), fmt_f(snr[i].back(), 2)});
      }
    t.print(a.csv);
    if (!a.plot.empty()) plot_blocks(a.plot, a.formats, blocks, snr, d);
    return;
  }
  Table t({"name", "format", "dist", "scale", "samples", "measured_snr_db", "model_snr_db", "model",
           "dynamic_range_db"});
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const ScaledSpec& s = specs[i];
    if (s.scaled()) {  // no closed-form model; the range is the scales'
      t.add({a.formats[i], to_string(s), to_string(d), fmt_g(d.scale), n_samples,
             fmt_f(measured_snr_db(s, x, cols), 2), "", "none", ""});
      continue;
    }
    const Format& f = s.element.format;
    const double model = snr_model_db(f, d);
    t.add({a.formats[i], to_string(f), to_string(d), fmt_g(d.scale), n_samples, fmt_f(measured_snr_db(f, x), 2),
           std::isnan(model) ? "" : fmt_f(model, 2),
           f.exp_bits == 0 ? (std::isnan(model) ? "none" : "fixed-point (App. A)") : "7.44+6.02p (App. B)",
           fmt_f(dynamic_range_db(f))});
  }
  t.print(a.csv);
}
}  // namespace

void register_snr(CLI::App& app) {
  auto args = std::make_shared<SnrArgs>();
  auto* cmd = app.add_subcommand("snr", "Measured and model SNR of formats on a distribution");
  cmd->add_option("formats", args->formats,
                  "Formats (1.4.3:10, e4m3fn) or scaled formats (mxfp4, nvfp4, e4m3fn@1x32:e8m0:ceil)")
      ->required();
  cmd->add_option("--dist", args->dist,
                  "normal, uniform, laplace, loguniform, student-t:DOF or normal-outliers:FRACTION:SCALE")
      ->capture_default_str();
  cmd->add_option("--scale", args->scale,
                  "normal: sigma; uniform: half-width; laplace: b; loguniform: max |x|; student-t: scale; "
                  "normal-outliers: sigma of the inliers")
      ->capture_default_str();
  cmd->add_option("--span", args->span, "loguniform: octaves below --scale")->capture_default_str();
  cmd->add_option("--samples", args->samples, "Number of samples")->capture_default_str();
  cmd->add_option("--seed", args->seed, "Sampling seed")->capture_default_str();
  cmd->add_option("--row", args->row,
                  "Scaled formats: the samples form rows of this many values (whole rows only), groups run "
                  "along them")
      ->capture_default_str();
  cmd->add_option("--blocks", args->blocks,
                  "Measure each format with each of these block sizes, e.g. 8,16,32,64,128,tensor (a plain "
                  "format gets E8M0 scales, floor rule)");
  cmd->add_option("--plot", args->plot, "With --blocks: write the sweep as STEM.svg and STEM.png");
  cmd->add_flag("--csv", args->csv, "Print CSV with a header row");
  cmd->callback([args] { run_snr(*args); });
}

}  // namespace fp8lab::cli
