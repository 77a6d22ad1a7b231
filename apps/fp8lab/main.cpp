// The command-line program, built as a module that the `fp8lab` launcher (apps/launcher)
// loads once it has set the environment libtorch starts with. Its entry point sets up the
// rest of the process (process.hpp), then runs one subcommand.
#include <cstdio>
#include <exception>
#include <filesystem>
#include <new>
#include <string>

#include "commands.hpp"
#include "fp8lab/core/error.hpp"
#include "process.hpp"

extern "C" int fp8lab_cli_main(int argc, char** argv) {
  fp8lab::cli::setup_process();
  CLI::App app{"fp8lab: 8-bit number formats for deep neural networks"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "fp8lab 0.1.0");
  fp8lab::cli::register_formats(app);
  fp8lab::cli::register_snr(app);
  fp8lab::cli::register_values(app);
  fp8lab::cli::register_quantize(app);
  fp8lab::cli::register_runs(app);
  fp8lab::cli::register_sweep(app);
  fp8lab::cli::register_report(app);
#ifdef FP8LAB_HAVE_TORCH
  fp8lab::cli::register_quickstart(app);
  fp8lab::cli::register_train(app);
  fp8lab::cli::register_evaluate(app);
#else
  fp8lab::cli::register_without_training(app);
#endif
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::RuntimeError& e) {
    return e.get_exit_code();  // a subcommand's own non-zero status, already reported
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "fp8lab: error: %s (see --help)\n", e.what());
    return 2;
  } catch (const fp8lab::Error& e) {
    std::fprintf(stderr, "fp8lab: error: %s\n", e.what());
    return 2;
  } catch (const std::filesystem::filesystem_error& e) {
    // A path given on the command line or in a config that the system refuses (not a
    // folder, too long, no permission, disk full): the user's to fix, not a bug.
    std::string what = e.what();  // "filesystem error: <operation>: <reason> [<path>]"
    if (what.rfind("filesystem error: ", 0) == 0) what.erase(0, 18);
    std::fprintf(stderr, "fp8lab: error: %s\n", what.c_str());
    return 2;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "fp8lab: error: not enough memory for this input (see docs/reliability.md)\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fp8lab: internal error: %s\n", e.what());
    return 3;
  }
  return 0;
}
