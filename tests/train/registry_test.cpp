// The registries: every name validation accepts is one construction knows, and an unknown
// name, in a file or through --set, is an error listing the known ones.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../common/testutil.hpp"
#include "fp8lab/settings/config.hpp"
#include "fp8lab/train/registry.hpp"
#include "fp8lab/train/trainer.hpp"

using namespace fp8lab;
using test::error_of;

TEST(Registry, UnknownNamesListTheKnownOnes) {
  const Registry<int> r("colour", {{"red", 1}, {"green", 2}});
  EXPECT_EQ(r.at("green"), 2);
  EXPECT_EQ(r.find("blue"), nullptr);
  EXPECT_EQ(error_of([&] { r.at("blue"); }), "unknown colour 'blue' (known: red, green)");
  EXPECT_EQ(r.names(), (std::vector<std::string>{"red", "green"}));
}

TEST(Registry, EveryOptimizerValidationAcceptsIsBuilt) {
  torch::Tensor w = torch::zeros({2}, torch::requires_grad());
  for (const auto& name : train::optimizers().names()) {
    settings::OptimizerConfig o;
    o.name = name;
    auto opt = train::optimizers().at(name)(o, {w});
    EXPECT_NE(opt, nullptr) << name;
  }
}

TEST(Registry, EveryScheduleGivesAFiniteRate) {
  settings::TrainConfig c;
  c.schedule.warmup_steps = 4;
  for (const auto& name : train::schedules().names()) {
    c.schedule.name = name;
    EXPECT_NO_THROW(train::validate(c)) << name;
    for (std::int64_t step : {0, 3, 4, 50, 99}) {
      const double lr = train::learning_rate(c, step, 100, 10);
      EXPECT_TRUE(std::isfinite(lr) && lr >= 0) << name << " step " << step;
    }
  }
}

TEST(Registry, EveryTaskKnowsItsModelsAndDataSets) {
  for (const auto& [task, info] : train::tasks().entries()) {
    EXPECT_FALSE(info.models().empty()) << task;
    EXPECT_FALSE(info.data_sets().names().empty()) << task;
    for (const auto& [name, set] : info.data_sets().entries()) {
      if (info.images) {
        EXPECT_NE(set.load_images, nullptr) << task << " " << name;
      }
    }
  }
}

TEST(Registry, UnknownNamesAreErrorsAlsoThroughSet) {
  for (const auto& [key, value, expected] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"optimizer.name", "adagrad", "optimizer.name: unknown optimizer 'adagrad' (known: sgd, adam, adamw, rmsprop)"},
           {"schedule.name", "cosine", "schedule.name: unknown schedule 'cosine' (known: constant, step"},
           {"task", "detection", "task: unknown task 'detection' (known: image-classification, translation, bert, language-model)"},
           {"data.name", "imagenet", "data.name: unknown image data set 'imagenet' (known: fashion-mnist"},
           {"model.name", "vgg16", "'vgg16' is not a model of task image-classification (known: resnet8"},
           {"model.bn_momentum", "0.1", "model.bn_momentum is for EfficientNet (resnet8 keeps PyTorch's 0.1)"},
           {"model.bn_momentum", "1.5", "model.bn_momentum must be in 0..1"},
           {"data.drop_long", "true", "data.drop_long is for translation"},
           {"train.beam", "4", "train.beam is for translation (task image-classification does not decode)"},
           {"train.bleu_lowercase", "true", "train.bleu_lowercase is for translation"},
           // Huge but finite values are range errors naming the key, never a failure inside the run.
           {"optimizer.lr", "1e300", "optimizer.lr must be in (0, 1e6]"},
           {"optimizer.weight_decay", "1e30", "optimizer.weight_decay must be in [0, 1e6]"},
           {"optimizer.eps", "10.0", "optimizer.eps must be in (0, 1]"},
           {"schedule.gamma", "1e300", "schedule factor, gamma, every_epochs must be in (0, 1e6]"},
           {"threads", "100000", "threads must be in 0..1024"},
           {"train.steps", "100000000000000", "train.steps must be in 0..10^12"},
           {"train.batch", "1000000000", "train.batch must be in 1..2^24"},
           {"train.mixup", "1e300", "train.mixup and train.cutmix must be in [0, 1e6]"},
           {"data.synthetic_classes", "1000000000", "data.synthetic_classes must be in 2..100000"},
           {"data.synthetic_train", "1000000000000", "data.synthetic_train and data.synthetic_test must be in 1..2^24"},
           {"data.synthetic_channels", "100000", "data.synthetic_channels must be in 1..1024"},
           {"quant.accumulate", "\"1.8.10@100000000000\"", "chunk 100000000000 is out of range 1..16777216"},
           {"quant.accumulate", "\"1.8.10@99999999999999999999999\"", "is out of range"},
           {"quant.accumulate", "\"1.8.10@-5\"", "is not a positive integer"},
           // Numbers TOML cannot hold are out of range, not of the wrong type.
           {"train.batch", "99999999999999999999", "'train.batch' is out of range (99999999999999999999 does not fit"},
           {"seed", "18446744073709551616", "'seed' is out of range"},
           {"optimizer.lr", "1e999", "'optimizer.lr' is out of range (1e999 is not a finite number)"},
           {"optimizer.lr", "fast", "'optimizer.lr' must be a number"},
           {"train.batch", "1.5", "'train.batch' must be an integer"}}) {
    const std::string e = error_of([&] { train::parse_train_config("", "t.toml", {key + "=" + value}); });
    EXPECT_NE(e.find(expected), std::string::npos) << key << "=" << value << ": " << e;
  }
  // A name of another task is refused too.
  const std::string e = error_of(
      [] { train::parse_train_config("", "t.toml", {"task=translation", "data.name=bible-en-es"}); });
  EXPECT_NE(e.find("is not a model of task translation"), std::string::npos) << e;
}
