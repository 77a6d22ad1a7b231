// The trainer tests' configs (trainer_test.cpp, data_parallel_test.cpp).
#pragma once

#include <filesystem>
#include <string>

#include "fp8lab/settings/config.hpp"

namespace fp8lab::test {

// A small synthetic problem a ResNet-8 of width 4 learns in a few dozen steps; its
// checkpoint is <dir>/<name>.ckpt.
inline settings::TrainConfig small_config(const std::string& name, const std::filesystem::path& dir) {
  settings::TrainConfig c;
  c.name = name;
  c.model.name = "resnet8";
  c.model.width = 4;
  c.data.name = "synthetic";
  c.data.image_size = 8;
  c.data.synthetic_train = 128;
  c.data.synthetic_test = 64;
  c.data.synthetic_classes = 2;
  c.data.synthetic_channels = 1;
  c.train.epochs = 3;
  c.train.batch = 16;
  c.threads = 1;
  c.quant.recipe = settings::recipe_setting("resnet32-mixed");
  c.train.checkpoint = (dir / (name + ".ckpt")).string();
  return c;
}

// small_config with every source of randomness and every piece of trainer state:
// augmentation, mixup, cutmix, EMA, checkpoint averaging, label smoothing, AdamW, warm-up,
// stochastic rounding, Backoff loss scaling, statistics.
inline settings::TrainConfig busy_config(const std::string& name, const std::filesystem::path& dir) {
  auto c = small_config(name, dir);
  c.data.augment = "crop:1+flip";
  c.train.mixup = 0.4;
  c.train.cutmix = 1.0;
  c.train.ema = 0.9;
  c.train.average_last = 2;
  c.train.eval_interval = 5;
  c.train.checkpoint_interval = 4;
  c.train.stats_interval = 3;
  c.train.label_smoothing = 0.1;
  c.optimizer.name = "adamw";
  c.optimizer.lr = 0.01;
  c.schedule.name = "linear";
  c.schedule.warmup_steps = 3;
  c.quant.recipe = settings::recipe_setting("a=1.4.3:10/sr,w=1.4.3:14,gx=1.5.2:33/sr/nan,gw=1.5.2:31");
  c.quant.loss_scale = settings::loss_scale_setting("backoff:init=4,interval=5");
  return c;
}

}  // namespace fp8lab::test
