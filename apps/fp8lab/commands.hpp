// One file per subcommand: each binds its flags into a plain struct and calls the library.
#pragma once

#include <CLI/CLI.hpp>

namespace fp8lab::cli {
void register_formats(CLI::App& app);
void register_snr(CLI::App& app);
void register_values(CLI::App& app);
void register_quantize(CLI::App& app);
void register_runs(CLI::App& app);
#ifdef FP8LAB_HAVE_TORCH
void register_quickstart(CLI::App& app);
void register_train(CLI::App& app);
void register_evaluate(CLI::App& app);
void register_sweep(CLI::App& app);
void register_report(CLI::App& app);
#endif
}  // namespace fp8lab::cli
