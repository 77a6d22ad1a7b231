// One file per subcommand: each binds its flags into a plain struct and calls the library.
#pragma once

#include <CLI/CLI.hpp>

#include <cmath>
#include <string>

namespace fp8lab::cli {
// A number in [lo, hi], NaN refused: CLI::Range compares, and NaN passes every comparison.
inline CLI::Validator finite_range(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(text, v) || !std::isfinite(v) || v < lo || v > hi)
          return "'" + text + "' is not a number in [" + CLI::detail::to_string(lo) + ", " + CLI::detail::to_string(hi) + "]";
        return "";
      },
      "FLOAT in [" + CLI::detail::to_string(lo) + " - " + CLI::detail::to_string(hi) + "]");
}

void register_formats(CLI::App& app);
void register_snr(CLI::App& app);
void register_values(CLI::App& app);
void register_quantize(CLI::App& app);
void register_runs(CLI::App& app);
void register_sweep(CLI::App& app);
void register_report(CLI::App& app);
#ifdef FP8LAB_HAVE_TORCH
void register_quickstart(CLI::App& app);
void register_train(CLI::App& app);
void register_evaluate(CLI::App& app);
#else
// train, evaluate and quickstart as commands that say the build cannot train (build.hpp).
void register_without_training(CLI::App& app);
#endif
}  // namespace fp8lab::cli
