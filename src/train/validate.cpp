// The checks of a config that need the registries and the other layers: names of the task,
// model, data set, optimizer and schedule; augmentation. (The quantization settings were
// parsed where the config was read, src/settings/config.cpp.)
#include <algorithm>
#include <string>

#include "fp8lab/core/error.hpp"
#include "fp8lab/core/files.hpp"
#include "fp8lab/data/images.hpp"
#include "fp8lab/settings/config.hpp"
#include "fp8lab/train/registry.hpp"
#include "fp8lab/nn/compute.hpp"

namespace fp8lab::train {

namespace {

void check(bool ok, const std::string& what) {
  if (!ok) throw Error("config: " + what);
}

// `what` looked up in `r`: the registry's error, prefixed with the config key.
template <class T>
const T& lookup(const Registry<T>& r, const std::string& key, const std::string& name) {
  try {
    return r.at(name);
  } catch (const Error& e) {
    throw Error("config: " + key + ": " + e.what());
  }
}

void validate_task(const settings::TrainConfig& c) {
  const TaskInfo& task = lookup(tasks(), "task", c.task);
  const auto models = task.models();
  if (std::find(models.begin(), models.end(), c.model.name) == models.end()) {
    std::string list;
    for (const auto& m : models) list += (list.empty() ? "" : ", ") + m;
    check(false, "model.name: '" + c.model.name + "' is not a model of task " + c.task + " (known: " + list + ")");
  }
  check(c.model.bn_momentum == 0 || c.model.name.rfind("efficientnet-", 0) == 0,
        "model.bn_momentum is for EfficientNet (" + c.model.name + " keeps PyTorch's 0.1)");
  const DataSetInfo& set = lookup(task.data_sets(), "data.name", c.data.name);
  check(!set.needs_dir || !c.data.dir.empty(), "data.dir must name the folder holding " + c.data.name);
  if (!task.images) {
    check(c.data.vocab_size >= 16 && c.data.vocab_size <= 1000000, "data.vocab_size must be in 16..1000000");
    check(c.data.max_tokens >= 4 && c.data.max_tokens <= 4096, "data.max_tokens must be in 4..4096");
    check(c.train.mixup == 0 && c.train.cutmix == 0, "mixup and cutmix are for images");
    check(c.data.augment == "none" || c.data.augment.empty(), "data.augment is for images");
    check(c.model.channels_last, "model.channels_last is for image models (task " + c.task + " has no convolutions)");
  }
  if (c.task == "translation") {
    check(!c.data.src_lang.empty() && !c.data.tgt_lang.empty() && c.data.src_lang != c.data.tgt_lang,
          "data.src_lang and data.tgt_lang must be two different suffixes");
    check(c.train.beam >= 1 && c.train.beam <= 64, "train.beam must be in 1..64");
  }
  check(c.train.beam == settings::TrainLoopConfig{}.beam || c.task == "translation",
        "train.beam is for translation (task " + c.task + " does not decode)");
  check(!c.train.bleu_lowercase || c.task == "translation",
        "train.bleu_lowercase is for translation (task " + c.task + " has no BLEU)");
  check(!c.data.drop_long || c.task == "translation", "data.drop_long is for translation");
  if (c.task == "bert") check(c.data.max_tokens >= 8, "data.max_tokens must be in 8..4096 for BERT");
}

}  // namespace

void complete_config(settings::TrainConfig& c) {
  adopt_recipe_settings(c);
  validate(c);
}

void validate(const settings::TrainConfig& c) {
  check_ranges(c);
  validate_task(c);
  try {
    data::parse_augment(c.data.augment);
  } catch (const Error& e) {
    check(false, std::string("data.augment: ") + e.what());
  }
  lookup(optimizers(), "optimizer.name", c.optimizer.name);
  const ScheduleInfo& schedule = lookup(schedules(), "schedule.name", c.schedule.name);
  check(!schedule.needs_warmup || c.schedule.warmup_steps > 0,
        "schedule " + c.schedule.name + " needs warmup_steps > 0");
}

settings::TrainConfig parse_train_config(const std::string& text, const std::string& source,
                               const std::vector<std::string>& overrides) {
  settings::TrainConfig c = settings::read_train_config(text, source, overrides);
  complete_config(c);
  return c;
}

settings::TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides) {
  settings::TrainConfig c = settings::read_train_config(read_file(path), path, overrides, true);
  complete_config(c);
  return c;
}

}  // namespace fp8lab::train
