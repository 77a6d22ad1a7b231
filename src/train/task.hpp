// What the trainer trains (private to src/train): a model, its data, its loss and its
// evaluation. The trainer owns everything else (optimizer, schedule, loss scaling, EMA,
// checkpoints, the store).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fp8lab/settings/config.hpp"
#include "fp8lab/train/registry.hpp"

namespace fp8lab::train {

class Task {
 public:
  virtual ~Task() = default;
  virtual torch::nn::Module& module() = 0;
  virtual std::string description() const = 0;  // model and data, for the banner
  virtual std::int64_t train_size() const = 0;   // examples an epoch draws from
  virtual std::int64_t eval_size() const = 0;
  virtual std::string metric_name(bool final) const = 0;
  // The training loss of the examples `idx` (int64); `step_seed` seeds the step's own
  // randomness (augmentation, mixup, masking).
  virtual torch::Tensor loss(const torch::Tensor& idx, std::uint64_t step_seed) = 0;
  // The metric (higher is better unless noted), without gradients, model in eval mode.
  // `final`: the end-of-training evaluation (translation: the test set; otherwise the same
  // set as during training).
  virtual double evaluate(bool final) = 0;
  // Whether the final evaluation differs from the periodic one (else it is reused).
  virtual bool separate_final() const { return false; }
  // Tasks that decode (translation): evaluate with the reference decoders, which recompute
  // the prefix at every step (models/transformer.hpp), instead of the cached ones.
  virtual void use_reference_decoding(bool) {}
  // The parts of the last evaluation's metric, as (name, value) (BERT: mlm_loss and
  // nsp_loss, whose sum is the metric); the trainer stores them beside it.
  virtual std::vector<std::pair<std::string, double>> metric_parts() const { return {}; }
  // What the last evaluation produced, one line per example (translation: the hypotheses);
  // empty for tasks whose evaluation produces no text.
  virtual std::vector<std::string> outputs() const { return {}; }
};

// The task `cfg.task` names (registry.hpp).
std::unique_ptr<Task> make_task(const settings::TrainConfig& cfg);

// Each task and its data sets (image_task.cpp, translation_task.cpp, bert_task.cpp, lm_task.cpp).
std::unique_ptr<Task> make_image_task(const settings::TrainConfig& cfg);
std::unique_ptr<Task> make_translation_task(const settings::TrainConfig& cfg);
std::unique_ptr<Task> make_bert_task(const settings::TrainConfig& cfg);
std::unique_ptr<Task> make_lm_task(const settings::TrainConfig& cfg);
const Registry<DataSetInfo>& image_data_sets();
const Registry<DataSetInfo>& translation_data_sets();
// One-sentence-per-line text for BERT and the language model: the English side of the
// Bible corpus (bible-en) or train.txt and dev.txt in data.dir (text).
const Registry<DataSetInfo>& text_data_sets();

// The non-empty lines of a text file; Error naming it when it cannot be opened.
std::vector<std::string> read_lines(const std::string& path);

// The folder of a text data set: data.dir, or the set's default folder, prepared on first
// use when the set has a preparation step.
std::string data_folder(const Registry<DataSetInfo>& sets, const settings::TrainConfig& cfg);

}  // namespace fp8lab::train
