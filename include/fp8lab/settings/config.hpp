// A training run's configuration: what `fp8lab train CONFIG.toml [--set key=value ...]`
// reads. Every field has a default; a config file sets some of them, `--set` overrides
// (dotted keys, TOML values: `--set optimizer.lr=0.01 --set data.augment='"crop+flip"'`;
// a value that is not valid TOML is taken as a string). Unknown keys and wrong types are
// errors naming the key and the file line (or the --set argument).
//
//   name = "resnet20-fmnist"
//   seed = 1
//   [model]     name = "resnet20"  width = 16
//   [data]      name = "fashion-mnist"  augment = "crop+flip"
//   [optimizer] name = "sgd"  lr = 0.1  momentum = 0.9  weight_decay = 5e-4
//   [schedule]  name = "step"  decay_at = [0.5, 0.75]  factor = 0.1
//   [train]     epochs = 2  batch = 128  label_smoothing = 0.0
//   [quant]     recipe = "resnet32-mixed"  loss_scale = "backoff"
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fp8lab/settings/compute_spec.hpp"
#include "fp8lab/settings/loss_scale_spec.hpp"
#include "fp8lab/settings/recipe.hpp"

namespace fp8lab::settings {

inline constexpr int kConfigSchema = 1;

struct ModelConfig {
  // image-classification: models::image_model_presets(); translation: transformer-base,
  // transformer-small, transformer-tiny, transformer-micro; bert: bert-large, bert-base, bert-tiny.
  std::string name = "resnet8";
  int width = 0;                 // ResNet first-stage width (0: the preset's)
  double width_mult = 0, depth_mult = 0;  // EfficientNet overrides (0: the preset's)
  double bn_momentum = 0;  // EfficientNet's batch-norm momentum (0: the preset's, 0.01)
  double dropout = -1;                    // (-1: the preset's)
  // Image models: convolution weights and input images channels-last (NHWC strides), the
  // layout of libtorch's fastest float32 convolutions on the CPU (oneDNN's). Values are the
  // same either way up to the order of the float32 sums (docs/spec.md §7.2).
  bool channels_last = true;
};

struct DataConfig {
  // fashion-mnist (Debian's dataset-fashion-mnist), mnist (an MNIST-layout `dir`),
  // cifar10, cifar100 (binary version in `dir`), folder (`dir`/train and `dir`/val image
  // folders), synthetic (generated; for tests and benchmarks). Translation: bible-en-es
  // (prepared from Debian's SWORD modules into `dir`, default data/bible-en-es), parallel
  // (`dir`/{train,dev,test}.{src_lang,tgt_lang}, one sentence per line). BERT: bible-en
  // (the English side of that corpus), text (`dir`/train.txt and dev.txt, one sentence per
  // line in document order: consecutive lines are the next-sentence pairs).
  std::string name = "fashion-mnist";
  std::string dir;               // "" : the default for the data set
  std::int64_t train_limit = 0;  // use the first N training examples (0: all)
  std::int64_t test_limit = 0;   // evaluate on the first N test examples (0: all)
  std::string augment = "none";  // none, crop, crop:P, flip, crop+flip
  int image_size = 0;            // folder: decode size (0: 224); synthetic: size (0: 16)
  std::int64_t synthetic_train = 512, synthetic_test = 256;
  int synthetic_classes = 4, synthetic_channels = 3;
  std::string src_lang = "en", tgt_lang = "es";  // translation direction
  int vocab_size = 8000;                         // joint SentencePiece vocabulary
  int max_tokens = 128;                          // longer sentences are truncated
  bool drop_long = false;  // translation: leave out the pairs with a side over max_tokens instead
};

struct OptimizerConfig {
  std::string name = "sgd";  // sgd, adam, adamw, rmsprop
  double lr = 0.1;
  double momentum = 0.9;     // sgd, rmsprop
  bool nesterov = false;     // sgd
  double weight_decay = 5e-4;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // adam, adamw (rmsprop: eps)
  double alpha = 0.99;                            // rmsprop smoothing
};

struct ScheduleConfig {
  // constant; step (lr *= factor at each fraction of training in decay_at, the paper's
  // ResNets); warmup-invsqrt (linear warm-up, then lr * sqrt(warmup / step): the
  // Transformer); linear (warm-up, then linear decay to 0: BERT); exponential (lr *= gamma
  // every `every_epochs` epochs after warm-up: EfficientNet).
  std::string name = "step";
  std::vector<double> decay_at = {0.5, 0.75};
  double factor = 0.1;
  std::int64_t warmup_steps = 0;
  double gamma = 0.97;
  double every_epochs = 2.4;
};

struct TrainLoopConfig {
  int epochs = 2;
  std::int64_t steps = 0;  // > 0: train this many steps instead of `epochs`
  int batch = 128;
  // The global batch as this many shards of (nearly) equal size, each with its own forward
  // and backward (batch norm sees its shard), their gradients summed in shard order. The
  // run is then the same, bit for bit, on any number of processes that divides it
  // (`fp8lab train --nproc N`, docs/training.md); 1: the batch in one piece.
  int micro_batches = 1;
  double label_smoothing = 0;
  double mixup = 0;   // Beta(alpha, alpha) mixing of pairs of examples; 0: off
  double cutmix = 0;  // Beta(alpha, alpha) box pasting; 0: off (with both, half the batches each)
  double ema = 0;     // decay of an exponential moving average of the weights used for
                      // evaluation (e.g. 0.9999); 0: off
  int average_last = 0;  // evaluate the final model on the average of the last K
                         // checkpoints' weights (0: off)
  std::int64_t eval_interval = 0;        // steps between evaluations (0: once per epoch)
  int stats_interval = 0;                // tensor statistics every N steps (0: off)
  std::int64_t checkpoint_interval = 0;  // steps between checkpoints (0: once per epoch)
  std::string checkpoint;                // checkpoint file ("" : <name>.ckpt)
  int beam = 1;                          // translation decoding: 1 greedy, else beam width
  bool bleu_lowercase = false;           // case-insensitive BLEU
  bool flush_denormals = false;          // CPU flush-to-zero for float32 (faster; not IEEE)
};

// A setting given as text and parsed once, where the config is read: `text` is the spelling
// the config's TOML and JSON keep (a run's identity stays what the user wrote), `value`
// what the code uses.
template <class T>
struct Spelled {
  std::string text;
  T value;
};

// quant.recipe: a preset name, a one-line recipe or a .toml file (read now).
Spelled<nn::Recipe> recipe_setting(const std::string& text);
// quant.loss_scale: none, static:K, backoff[:...], logmax[:...] (docs/spec.md §5).
Spelled<nn::LossScaleConfig> loss_scale_setting(const std::string& text);
// quant.grad_comm: fp32, or a quantizer of current scaling and at most 16 bits.
Spelled<nn::KindQuant> grad_comm_setting(const std::string& text);
// Each throws Error "config: quant.KEY: ..." naming the problem.

struct QuantConfig {
  Spelled<nn::Recipe> recipe = recipe_setting("fp32");
  Spelled<nn::LossScaleConfig> loss_scale = loss_scale_setting("none");
  // How products run (fp32, bf16 or auto, docs/spec.md §7) and how their sums accumulate
  // (fp32, FORMAT@CHUNK or a dot model, §7.3-7.4). Unset: not given in the config file or by --set;
  // complete_config then takes the recipe's value, else fp32 (one precedence rule:
  // explicit, then the recipe, then the default).
  std::optional<nn::Compute> compute;
  std::optional<nn::Accumulation> accumulate;
  // The format the gradients of the micro-batches (and processes) travel in before they are
  // summed in float32: fp32, or a quantizer (docs/spec.md §6.4: "1.5.2:20",
  // "e5m2@tensor:fp32:nearest", "mxfp8_e5m2/stochastic"), each parameter's gradient
  // quantized as one row (docs/training.md).
  Spelled<nn::KindQuant> grad_comm = grad_comm_setting("fp32");
};

struct TrainConfig {
  std::string name = "train";
  std::string task = "image-classification";  // or translation, bert
  std::uint64_t seed = 1;
  int threads = 0;  // 0: all cores
  ModelConfig model;
  DataConfig data;
  OptimizerConfig optimizer;
  ScheduleConfig schedule;
  TrainLoopConfig train;
  QuantConfig quant;
};

// The fields of a TOML config (`source` names it in errors), then `overrides` ("key=value"
// each), every value checked for type, range and finiteness (check_ranges). With
// `require_schema` the text must have a `schema` line (a config file). Names (task, model,
// data set, optimizer, schedule) are validate()'s (fp8lab/train/registry.hpp); the quantization settings are parsed
// here (a recipe file is read). No libtorch (src/settings/config.cpp).
TrainConfig read_train_config(const std::string& toml_text, const std::string& source,
                              const std::vector<std::string>& overrides = {}, bool require_schema = false);
// The name as a file name, finiteness, and each numeric field's range.
void check_ranges(const TrainConfig& c);

// quant.compute and quant.accumulate where the config leaves them unset: the recipe's
// `compute` and `accumulate` (docs/spec.md §4.2), else fp32. A value given explicitly is
// kept, whatever the recipe file says.
void adopt_recipe_settings(TrainConfig& c);
// The products' path and accumulation of a config: unset (a config never completed) is fp32.
inline nn::Compute compute_of(const QuantConfig& q) { return q.compute.value_or(nn::Compute::fp32); }
inline nn::Accumulation accumulation_of(const QuantConfig& q) { return q.accumulate.value_or(nn::Accumulation{}); }
// adopt_recipe_settings, then check_ranges: all a program without the training layer (a
// build without libtorch) can check. Names of tasks, models and data sets are validate()'s
// (fp8lab/train/registry.hpp), which also does this.
void complete_settings(TrainConfig& c);

// The full configuration as TOML (every field; reads back to the same config) and JSON
// (what the results store records).
std::string to_toml(const TrainConfig& c);
std::string to_json(const TrainConfig& c);

}  // namespace fp8lab::settings
