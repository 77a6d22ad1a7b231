// Config files: parsing, --set overrides, errors that name the key and line, round trip.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "../common/testutil.hpp"
#include "fp8lab/train/registry.hpp"

using namespace fp8lab;
using train::parse_train_config;
using test::error_of;

TEST(Config, DefaultsSectionsAndOverrides) {
  const auto c = parse_train_config(R"(
name = "x"
seed = 7
[model]
name = "resnet20"
width = 8
[optimizer]
name = "adamw"
lr = 3e-4
[schedule]
decay_at = [0.3, 0.6, 0.9]
[train]
epochs = 5
)", "t.toml", {"optimizer.lr=0.01", "quant.recipe=a=1.4.3:10,w=1.4.3:14", "data.augment=crop+flip",
               "train.ema=0.999", "optimizer.nesterov=true", "model.name=resnet32"});
  EXPECT_EQ(c.name, "x");
  EXPECT_EQ(c.seed, 7u);
  EXPECT_EQ(c.model.name, "resnet32");
  EXPECT_EQ(c.model.width, 8);
  EXPECT_EQ(c.optimizer.name, "adamw");
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 0.01);
  EXPECT_TRUE(c.optimizer.nesterov);
  EXPECT_EQ(c.schedule.decay_at, (std::vector<double>{0.3, 0.6, 0.9}));
  EXPECT_EQ(c.train.epochs, 5);
  EXPECT_EQ(c.train.batch, 128);  // default kept
  EXPECT_EQ(c.quant.recipe.text, "a=1.4.3:10,w=1.4.3:14");
  EXPECT_EQ(c.quant.recipe.value, nn::parse_recipe("a=1.4.3:10,w=1.4.3:14"));  // parsed where read
  EXPECT_EQ(c.data.augment, "crop+flip");
  EXPECT_DOUBLE_EQ(c.train.ema, 0.999);
}

TEST(Config, TomlAndJsonRoundTrip) {
  auto c = parse_train_config("", "empty", {"optimizer.lr=0.1234567890123", "train.checkpoint=a \"b\".ckpt",
                                            "schedule.decay_at=[0.25]", "seed=18446744073709551"});
  const std::string t = settings::to_toml(c);
  const auto back = parse_train_config(t, "back");
  EXPECT_EQ(settings::to_toml(back), t);
  EXPECT_EQ(settings::to_json(back), settings::to_json(c));
  EXPECT_DOUBLE_EQ(back.optimizer.lr, 0.1234567890123);
  EXPECT_EQ(back.train.checkpoint, "a \"b\".ckpt");
  EXPECT_NE(t.find("lr = 0.1234567890123\n"), std::string::npos) << t;
}

// quant.compute at its default (fp32: the products of every run recorded before the key
// existed) is left out of the JSON, so stored configs, sweep identities and checkpoints
// stay as they were; any other value is recorded, and a bad one is refused by name where
// the config is read.
TEST(Config, ComputeIsRecordedExceptAtItsDefault) {
  const auto plain = parse_train_config("", "plain");
  EXPECT_EQ(settings::to_json(plain).find("compute"), std::string::npos);
  const auto fp32 = parse_train_config("", "fp32", {"quant.compute=fp32"});
  EXPECT_EQ(settings::to_json(fp32), settings::to_json(plain));
  const auto with_auto = parse_train_config("", "auto", {"quant.compute=auto"});
  EXPECT_EQ(with_auto.quant.compute, nn::Compute::auto_);
  EXPECT_NE(settings::to_json(with_auto).find("\"compute\":\"auto\""), std::string::npos);
  EXPECT_NE(settings::to_toml(with_auto).find("compute = \"auto\""), std::string::npos);
  const std::string e = test::error_of([] { settings::read_train_config("[quant]\ncompute = \"fp16\"\n", "c.toml"); });
  EXPECT_NE(e.find("c.toml:2: 'quant.compute'"), std::string::npos) << e;
  EXPECT_NE(test::error_of([] { settings::read_train_config("[quant]\ncompute = 16\n", "c.toml"); })
                .find("'quant.compute' must be a string (fp32, bf16 or auto)"),
            std::string::npos);
}

// quant.accumulate likewise (fp32 by default, docs/spec.md §7.3).
TEST(Config, AccumulateIsRecordedExceptAtItsDefault) {
  const auto plain = parse_train_config("", "plain");
  EXPECT_EQ(settings::to_json(plain).find("accumulate"), std::string::npos);
  const auto fp32 = parse_train_config("", "fp32", {"quant.accumulate=fp32"});
  EXPECT_EQ(settings::to_json(fp32), settings::to_json(plain));
  const auto chunked = parse_train_config("", "chunked", {"quant.accumulate=1.8.10@128"});
  EXPECT_EQ(chunked.quant.accumulate->chunk, 128);
  EXPECT_NE(settings::to_json(chunked).find("\"accumulate\":\"1.8.10@128\""), std::string::npos);
  EXPECT_NE(settings::to_toml(chunked).find("accumulate = \"1.8.10@128\""), std::string::npos);
  const std::string e = test::error_of([] { parse_train_config("", "t", {"quant.accumulate=1.8.10@0"}); });
  EXPECT_NE(e.find("quant.accumulate"), std::string::npos) << e;
  EXPECT_NE(e.find("positive integer"), std::string::npos) << e;
}

// model.channels_last is on by default and recorded; off (the layout of the runs recorded
// before the key existed) it is left out, so those runs keep their identity. It is for
// image models only.
TEST(Config, ChannelsLastIsRecordedWhenOn) {
  const auto plain = parse_train_config("", "plain");
  EXPECT_TRUE(plain.model.channels_last);
  EXPECT_NE(settings::to_json(plain).find("\"channels_last\":true"), std::string::npos);
  const auto nchw = parse_train_config("", "nchw", {"model.channels_last=false"});
  EXPECT_FALSE(nchw.model.channels_last);
  EXPECT_EQ(settings::to_json(nchw).find("channels_last"), std::string::npos);
  train::validate(nchw);
  const std::string e = test::error_of([] {
    parse_train_config("", "lm", {"task=\"language-model\"", "model.name=\"gpt-tiny\"", "data.name=\"text\"",
                                  "data.dir=\"/nonexistent\"", "model.channels_last=false"});
  });
  EXPECT_NE(e.find("model.channels_last is for image models"), std::string::npos) << e;
}

// One precedence rule for quant.compute and quant.accumulate (docs/spec.md §7): a value given
// explicitly (config file or --set) beats the recipe file's, which beats the default.
// Every source of a value, alone and against the others.
TEST(Config, ExplicitSettingsBeatTheRecipeFileWhichBeatsTheDefault) {
  const auto dir = test::temp_dir("fp8lab_config_recipe");
  const std::string recipe = (dir / "deepseek.toml").string();
  std::ofstream(recipe) << "a = \"e4m3fn\"\nw = \"e4m3fn\"\ncompute = \"auto\"\naccumulate = \"1.8.10@128\"\n";
  const std::string with_recipe = "[quant]\nrecipe = \"" + recipe + "\"\n";
  const auto chunk_of = [](const settings::TrainConfig& c) { return c.quant.accumulate->chunk; };
  // The default alone.
  const auto plain = parse_train_config("", "t");
  EXPECT_EQ(plain.quant.compute, nn::Compute::fp32);
  EXPECT_EQ(chunk_of(plain), 0);
  // The recipe file alone completes the config, and the run records its values.
  const auto from_file = parse_train_config(with_recipe, "t");
  EXPECT_EQ(from_file.quant.compute, nn::Compute::auto_);
  EXPECT_EQ(chunk_of(from_file), 128);
  EXPECT_NE(settings::to_json(from_file).find("\"accumulate\":\"1.8.10@128\""), std::string::npos);
  // The config file's own value beats the recipe file's, the default's spelling included.
  const auto in_file = parse_train_config(with_recipe + "compute = \"fp32\"\naccumulate = \"fp32\"\n", "t");
  EXPECT_EQ(in_file.quant.compute, nn::Compute::fp32);
  EXPECT_EQ(chunk_of(in_file), 0);
  // --set beats the recipe file (quant.compute=fp32 was once replaced by the file's auto).
  const auto by_set = parse_train_config(with_recipe, "t", {"quant.compute=fp32", "quant.accumulate=1.5.10@32"});
  EXPECT_EQ(by_set.quant.compute, nn::Compute::fp32);
  EXPECT_EQ(chunk_of(by_set), 32);
  // --set beats the config file too.
  const auto both = parse_train_config("[quant]\ncompute = \"bf16\"\n", "t", {"quant.compute=auto"});
  EXPECT_EQ(both.quant.compute, nn::Compute::auto_);
  // A config built in code and never completed: train() and validate-free readers see fp32
  // until complete_config takes the recipe file's values.
  settings::TrainConfig raw;
  raw.quant.recipe = settings::recipe_setting(recipe);
  EXPECT_FALSE(raw.quant.compute);
  EXPECT_EQ(settings::compute_of(raw.quant), nn::Compute::fp32);
  train::complete_config(raw);
  EXPECT_EQ(raw.quant.compute, nn::Compute::auto_);
  std::filesystem::remove_all(dir);
}

// The shipped recipe file of DeepSeek-V3's FP8 recipe: its tiles, blocks, compute path and
// accumulation reach the run's config.
TEST(Config, ShippedDeepSeekRecipeSetsComputeAndAccumulation) {
  const std::string recipe = std::string(FP8LAB_SOURCE_DIR) + "/configs/recipes/deepseek-v3.toml";
  const auto c = parse_train_config("", "t", {"quant.recipe=" + recipe});
  EXPECT_EQ(c.quant.compute, nn::Compute::auto_);
  EXPECT_EQ(nn::to_string(*c.quant.accumulate), "1.8.13@128");
}

TEST(Config, StringsAreUtf8TextAndRoundTripExactly) {
  // Non-ASCII text round-trips through TOML; control characters and bytes that are not
  // UTF-8 are refused (a NUL would cut a path short, a DEL cannot be written back).
  const auto c = parse_train_config("[data]\ndir = \"/donn\u00e9es/\u03b1\u03b2\"\n", "c.toml");
  EXPECT_EQ(c.data.dir, "/donn\xc3\xa9" "es/\xce\xb1\xce\xb2");
  EXPECT_EQ(parse_train_config(settings::to_toml(c), "back").data.dir, c.data.dir);
  for (const char* bad : {"[data]\ndir = \"a\\u0000b\"\n", "[data]\ndir = \"a\\u007fb\"\n",
                                 "[data]\ndir = \"a\\tb\"\n"}) {
    const std::string e = error_of([&] { parse_train_config(bad, "c.toml"); });
    EXPECT_NE(e.find("c.toml:2: 'data.dir' must be UTF-8 text without control characters"), std::string::npos) << e;
  }
  const std::string e = error_of([] { parse_train_config("", "c.toml", {"data.dir=/x/\xff"}); });
  EXPECT_NE(e.find("'data.dir' must be UTF-8 text without control characters"), std::string::npos) << e;
  // A plane-15 private-use character in a --set value (which the TOML reader never sees)
  // is refused as well: otherwise the config would not read back (a fuzz input found this).
  const std::string p15 = error_of([] { parse_train_config("", "c.toml", {"data.dir=/x/\xf3\xb5\x93\x93"}); });
  EXPECT_NE(p15.find("'data.dir' must be UTF-8 text without control characters or plane-15"), std::string::npos) << p15;
}

TEST(Config, ErrorsNameKeyAndLine) {
  std::string e = error_of([] { parse_train_config("name = \"a\"\n[train]\nepoch = 3\n", "c.toml"); });
  EXPECT_NE(e.find("c.toml:3:"), std::string::npos) << e;
  EXPECT_NE(e.find("unknown key 'train.epoch'"), std::string::npos) << e;
  EXPECT_NE(e.find("epochs"), std::string::npos) << e;  // lists the known keys
  e = error_of([] { parse_train_config("[trian]\nepochs = 3\n", "c.toml"); });
  EXPECT_NE(e.find("unknown section [trian]"), std::string::npos) << e;
  e = error_of([] { parse_train_config("[train]\nbatch = \"big\"\n", "c.toml"); });
  EXPECT_NE(e.find("c.toml:2:"), std::string::npos) << e;
  EXPECT_NE(e.find("'train.batch' must be an integer"), std::string::npos) << e;
  e = error_of([] { parse_train_config("[train\n", "c.toml"); });
  EXPECT_NE(e.find("c.toml:1:"), std::string::npos) << e;
  e = error_of([] { parse_train_config("", "c.toml", {"train.batch"}); });
  EXPECT_NE(e.find("--set train.batch: expected key=value"), std::string::npos) << e;
  e = error_of([] { parse_train_config("", "c.toml", {"train.bach=3"}); });
  EXPECT_NE(e.find("--set train.bach=3: unknown key"), std::string::npos) << e;
  e = error_of([] { parse_train_config("", "c.toml", {"train.batch=0"}); });
  EXPECT_NE(e.find("train.batch must be in 1..2^24"), std::string::npos) << e;
  e = error_of([] { parse_train_config("", "c.toml", {"model.name=resnet19"}); });
  EXPECT_NE(e.find("'resnet19' is not a model"), std::string::npos) << e;
  e = error_of([] { parse_train_config("", "c.toml", {"optimizer.name=lion"}); });
  EXPECT_NE(e.find("lion"), std::string::npos) << e;
  e = error_of([] { parse_train_config("", "c.toml", {"data.name=cifar10"}); });
  EXPECT_NE(e.find("data.dir must name"), std::string::npos) << e;
  e = error_of([] { parse_train_config("", "c.toml", {"data.augment=rotate"}); });
  EXPECT_NE(e.find("unknown part 'rotate'"), std::string::npos) << e;
  e = error_of([] { parse_train_config("schema = 9\n", "c.toml"); });
  EXPECT_NE(e.find("newer"), std::string::npos) << e;
  e = error_of([] { train::load_train_config("/nonexistent/x.toml"); });
  EXPECT_NE(e.find("/nonexistent/x.toml"), std::string::npos) << e;
}

TEST(Config, ShippedConfigsParse) {
  for (const auto& entry : std::filesystem::directory_iterator(FP8LAB_SOURCE_DIR "/configs")) {
    if (entry.path().extension() != ".toml") continue;
    const std::string text = [&] {
      std::ifstream in(entry.path());
      return std::string(std::istreambuf_iterator<char>(in), {});
    }();
    if (text.find("[recipe]") != std::string::npos || text.find("[[override]]") != std::string::npos) continue;
    EXPECT_EQ(error_of([&] { train::load_train_config(entry.path().string()); }), "") << entry.path();
  }
}
