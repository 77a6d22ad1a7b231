// fp8lab evaluate CONFIG [--set key=value ...] [--checkpoint FILE] [--decoder cached|reference]
// [--out FILE]: the final evaluation of a run's checkpoint (finished or not), timed; with
// --out, what it produced (translation: one hypothesis per test sentence).
#include <cstdio>
#include <filesystem>
#include <utility>
#include <memory>
#include <string>
#include <vector>

#include "commands.hpp"
#include "fp8lab/core/files.hpp"
#include "fp8lab/settings/config.hpp"
#include "fp8lab/train/registry.hpp"
#include "fp8lab/train/trainer.hpp"
#include "table.hpp"

namespace fp8lab::cli {

namespace {
struct EvaluateArgs {
  std::string config;
  std::vector<std::string> set;
  std::string checkpoint, decoder = "cached", out;
};

// The data folder the run reads (data.dir, or its data set's default folder; "" for none).
std::string data_dir_of(const settings::TrainConfig& cfg) {
  if (!cfg.data.dir.empty()) return cfg.data.dir;
  const auto& sets = train::tasks().at(cfg.task).data_sets();
  return sets.contains(cfg.data.name) ? sets.at(cfg.data.name).default_dir : std::string();
}

// --out may be no file the evaluation reads, checked before the evaluation runs: not the
// config, not the checkpoint (by name or as a file: a link, another spelling), and not a file
// of the data folder (hypotheses over the test set would change every later evaluation).
void check_out_is_no_input(const std::string& out, const std::string& config, const std::string& checkpoint,
                           const std::string& data_dir) {
  for (const auto& [what, path] : {std::pair<const char*, std::string>{"the config", config}, {"the checkpoint", checkpoint}})
    if (out == path || same_file(out, path))
      throw Error("--out " + out + ": is " + what + " (" + path + "); write the outputs to another file");
  if (data_dir.empty()) return;
  const std::string parent = std::filesystem::path(out).parent_path().string();
  if (same_file(parent.empty() ? "." : parent, data_dir))
    throw Error("--out " + out + ": is in the data folder " + data_dir +
                ", which the evaluation reads; write the outputs elsewhere");
}

int run_evaluate(const EvaluateArgs& a) {
  const settings::TrainConfig cfg = train::load_train_config(a.config, a.set);
  train::EvaluateOptions opt;
  opt.checkpoint = a.checkpoint;
  if (!a.out.empty())
    check_out_is_no_input(a.out, a.config, a.checkpoint.empty() ? train::checkpoint_path(cfg) : a.checkpoint,
                          data_dir_of(cfg));
  opt.reference_decoding = a.decoder == "reference";
  const train::Evaluation e = train::evaluate_checkpoint(cfg, opt);
  Table t({"metric", "value", "step", "seconds"});
  for (const auto& [name, value] : e.metrics)
    t.add({name, fmt_f(value, 4), std::to_string(e.step), fmt_f(e.seconds, 1)});
  t.print(false);
  std::fflush(stdout);
  std::fprintf(stderr, "%s; %s decoding\n", e.model_description.c_str(), a.decoder.c_str());
  if (!a.out.empty()) {
    if (e.outputs.empty()) throw Error("--out: this task's evaluation produces no text (translation does)");
    std::string text;
    for (const std::string& line : e.outputs) text += line + "\n";
    write_file_atomic(a.out, text);
    std::fprintf(stderr, "%zu outputs in %s\n", e.outputs.size(), a.out.c_str());
  }
  return 0;
}
}  // namespace

void register_evaluate(CLI::App& app) {
  auto args = std::make_shared<EvaluateArgs>();
  auto* cmd = app.add_subcommand(
      "evaluate", "Evaluate a run's checkpoint as its final evaluation does (translation: the test set), timed");
  cmd->add_option("config", args->config, "The run's config file (TOML)")->required();
  cmd->add_option("--set", args->set,
                  "Override a config key as the run did (--set ...); train.beam, data.test_limit, quant.compute "
                  "and train.bleu_lowercase may also differ from the run's");
  cmd->add_option("--checkpoint", args->checkpoint, "Checkpoint file (default: the config's train.checkpoint)");
  cmd->add_option("--decoder", args->decoder,
                  "Translation: cached (the decoder cache, default) or reference (recomputes the prefix at every "
                  "step; slow, for checks)")
      ->check(CLI::IsMember({"cached", "reference"}))
      ->capture_default_str();
  cmd->add_option("--out", args->out, "Write the evaluation's outputs, one per line (translation: hypotheses)");
  cmd->callback([args] {
    const int rc = run_evaluate(*args);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace fp8lab::cli
