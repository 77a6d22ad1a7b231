// The names a training config chooses among, one table each: tasks (each with its models
// and data sets), optimizers and learning-rate schedules. `validate` checks a config
// against these tables and the trainer builds from the same entries, so every name
// validation accepts is one the trainer knows; an unknown name is an error listing the
// known ones (also for `--set`).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fp8lab/core/registry.hpp"
#include "fp8lab/settings/config.hpp"

namespace at {
class Tensor;
}
namespace torch::optim {
class Optimizer;
}
namespace fp8lab::data {
class ImageSource;
}

namespace fp8lab::train {

class Task;  // src/train/task.hpp

// A data set of a task. Image data sets load their two splits; text data sets are files in
// a folder (`dir`, or `default_dir` prepared by `prepare` when it is empty).
using ImageSplits = std::pair<std::shared_ptr<data::ImageSource>, std::shared_ptr<data::ImageSource>>;
struct DataSetInfo {
  bool needs_dir = false;        // data.dir must name the folder holding it
  std::string default_dir;       // the folder when data.dir is empty ("" : none)
  void (*prepare)(const std::string& dir) = nullptr;  // builds `dir` on first use
  ImageSplits (*load_images)(const settings::TrainConfig&) = nullptr;  // image data sets: (train, test)
  std::string train_file, dev_file;  // text data sets (BERT, language model): file names inside the folder
};

struct TaskInfo {
  std::unique_ptr<Task> (*make)(const settings::TrainConfig&);
  std::vector<std::string> (*models)();  // the model.name values it trains
  const Registry<DataSetInfo>& (*data_sets)();
  bool images = false;                   // augmentation, mixup and cutmix apply
};

using OptimizerFactory = std::unique_ptr<torch::optim::Optimizer> (*)(const settings::OptimizerConfig&, std::vector<at::Tensor>);

// The learning rate of 0-based `step` of `total` (warm-up is applied by learning_rate()).
struct ScheduleInfo {
  double (*lr)(const settings::TrainConfig& c, std::int64_t step, std::int64_t total, std::int64_t steps_per_epoch);
  bool needs_warmup = false;  // schedule.warmup_steps must be > 0
  bool own_warmup = false;    // the formula includes its warm-up (learning_rate() adds none)
};

const Registry<TaskInfo>& tasks();
const Registry<OptimizerFactory>& optimizers();
const Registry<ScheduleInfo>& schedules();

// check_ranges, then the names against these tables (task, model, data set, optimizer,
// schedule) and what the other layers check (augmentation): src/train/validate.cpp.
void validate(const settings::TrainConfig& c);
// adopt_recipe_settings, then validate: what every config read from text goes through.
void complete_config(settings::TrainConfig& c);
// read_train_config, then complete_config.
settings::TrainConfig parse_train_config(const std::string& toml_text, const std::string& source,
                               const std::vector<std::string>& overrides = {});
// A config file: a regular file whose TOML has a `schema` line (an empty file, a folder or a
// device is an error, never the defaults), read, completed from its recipe file and validated.
settings::TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides = {});

}  // namespace fp8lab::train
