// A build without libtorch: train, evaluate and quickstart exist as commands that say why
// they cannot run here, instead of CLI11's "unknown subcommand".
#include "build.hpp"
#include "commands.hpp"
#include "fp8lab/core/error.hpp"

namespace fp8lab::cli {

void register_without_training(CLI::App& app) {
  for (const char* name : {"quickstart", "train", "evaluate"}) {
    auto* cmd = app.add_subcommand(name, "Not in this build (built without libtorch)");
    cmd->allow_extras();
    cmd->callback([] { throw Error(kNoTrainingLayer); });
  }
}

}  // namespace fp8lab::cli
