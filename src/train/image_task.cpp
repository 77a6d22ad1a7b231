// The image-classification task: an image model on an image data set, with augmentation,
// mixup and cutmix; top-1 accuracy.
#include <filesystem>
#include <fstream>
#include <random>

#include "fp8lab/core/random.hpp"
#include "fp8lab/data/images.hpp"
#include "fp8lab/train/registry.hpp"
#include "fp8lab/models/image_models.hpp"
#include "task.hpp"

namespace fp8lab::train {

namespace fs = std::filesystem;

namespace {

// The first `n` examples of a source.
class PrefixSource final : public data::ImageSource {
 public:
  PrefixSource(std::shared_ptr<data::ImageSource> s, std::int64_t n) : s_(std::move(s)), n_(std::min(n, s_->size())) {}
  std::int64_t size() const override { return n_; }
  std::int64_t num_classes() const override { return s_->num_classes(); }
  std::array<std::int64_t, 3> shape() const override { return s_->shape(); }
  std::pair<torch::Tensor, torch::Tensor> bytes(const torch::Tensor& i) const override { return s_->bytes(i); }

 private:
  std::shared_ptr<data::ImageSource> s_;
  std::int64_t n_;
};

ImageSplits load_idx(const settings::TrainConfig& c) {
  const std::string dir = c.data.dir.empty() ? data::kFashionMnistDir : c.data.dir;
  return {data::memory_source(data::load_mnist_folder(dir, true)), data::memory_source(data::load_mnist_folder(dir, false))};
}

template <int kClasses>
ImageSplits load_cifar(const settings::TrainConfig& c) {
  return {data::memory_source(data::load_cifar(c.data.dir, true, kClasses)),
          data::memory_source(data::load_cifar(c.data.dir, false, kClasses))};
}

ImageSplits load_folder(const settings::TrainConfig& c) {
  const auto& d = c.data;
  const std::int64_t size = d.image_size > 0 ? d.image_size : 224;
  auto tr = data::image_folder_source((fs::path(d.dir) / "train").string(), size);
  const fs::path val = fs::exists(fs::path(d.dir) / "val") ? fs::path(d.dir) / "val" : fs::path(d.dir) / "test";
  auto te = data::image_folder_source(val.string(), size);
  if (te->num_classes() != tr->num_classes())
    throw Error(val.string() + ": " + std::to_string(te->num_classes()) + " classes but train has " +
                std::to_string(tr->num_classes()));
  return {tr, te};
}

// One draw split in two, so both halves share the class patterns.
ImageSplits load_synthetic(const settings::TrainConfig& c) {
  const auto& d = c.data;
  const std::int64_t size = d.image_size > 0 ? d.image_size : 16;
  data::ImageSet all = data::synthetic_images(d.synthetic_train + d.synthetic_test, d.synthetic_channels, size,
                                              d.synthetic_classes, c.seed ^ 0x5eed);
  data::ImageSet a = all, b = all;
  a.images = all.images.slice(0, 0, d.synthetic_train).clone();
  a.labels = all.labels.slice(0, 0, d.synthetic_train).clone();
  b.images = all.images.slice(0, d.synthetic_train).clone();
  b.labels = all.labels.slice(0, d.synthetic_train).clone();
  return {data::memory_source(a), data::memory_source(b)};
}

ImageSplits load_images(const settings::TrainConfig& c) {
  auto [tr, te] = image_data_sets().at(c.data.name).load_images(c);
  if (c.data.train_limit > 0) tr = std::make_shared<PrefixSource>(tr, c.data.train_limit);
  if (c.data.test_limit > 0) te = std::make_shared<PrefixSource>(te, c.data.test_limit);
  return {tr, te};
}

struct Mixed {
  torch::Tensor x, y2;
  double lam = 1;  // weight of the original labels
};

double sample_beta(double a, std::mt19937_64& rng) {
  std::gamma_distribution<double> g(a, 1.0);
  const double u = g(rng), v = g(rng);
  return u + v > 0 ? u / (u + v) : 0.5;
}

Mixed mix(const torch::Tensor& x, const torch::Tensor& y, const settings::TrainLoopConfig& t, std::uint64_t seed) {
  Mixed m{x, {}, 1};
  if (t.mixup <= 0 && t.cutmix <= 0) return m;
  std::mt19937_64 rng(seed);
  const bool cut = t.cutmix > 0 && (t.mixup <= 0 || (rng() & 1));
  const double lam = sample_beta(cut ? t.cutmix : t.mixup, rng);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(rng());
  const torch::Tensor perm = torch::randperm(x.size(0), gen, torch::kInt64);
  m.y2 = y.index_select(0, perm);
  const torch::Tensor xp = x.index_select(0, perm);
  if (!cut) {
    m.x = x * lam + xp * (1 - lam);
    m.lam = lam;
    return m;
  }
  // CutMix: paste a box of area (1 - lam) from the partner; lam becomes the exact area kept.
  const std::int64_t h = x.size(2), w = x.size(3);
  const double r = std::sqrt(1 - lam);
  const auto bh = static_cast<std::int64_t>(h * r), bw = static_cast<std::int64_t>(w * r);
  const auto cy = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(h));
  const auto cx = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(w));
  const std::int64_t y0 = std::clamp<std::int64_t>(cy - bh / 2, 0, h), y1 = std::clamp<std::int64_t>(cy + bh / 2, 0, h);
  const std::int64_t x0 = std::clamp<std::int64_t>(cx - bw / 2, 0, w), x1 = std::clamp<std::int64_t>(cx + bw / 2, 0, w);
  m.x = x.clone();
  m.x.slice(2, y0, y1).slice(3, x0, x1).copy_(xp.slice(2, y0, y1).slice(3, x0, x1));
  m.lam = 1.0 - static_cast<double>((y1 - y0) * (x1 - x0)) / static_cast<double>(h * w);
  return m;
}

class ImageTask final : public Task {
 public:
  explicit ImageTask(const settings::TrainConfig& c) : cfg_(c) {
    std::tie(train_src_, test_src_) = load_images(c);
    train_b_ = std::make_unique<data::ImageBatcher>(train_src_);
    test_b_ = std::make_unique<data::ImageBatcher>(test_src_, train_b_->mean(), train_b_->std());
    aug_ = data::parse_augment(c.data.augment);
    models::ImageModelSpec spec;
    spec.name = c.model.name;
    spec.in_channels = static_cast<int>(train_src_->shape()[0]);
    spec.num_classes = static_cast<int>(train_src_->num_classes());
    spec.image_size = static_cast<int>(train_src_->shape()[1]);
    spec.width = c.model.width;
    spec.width_mult = c.model.width_mult;
    spec.depth_mult = c.model.depth_mult;
    spec.dropout = c.model.dropout;
    spec.bn_momentum = c.model.bn_momentum;
    model_ = models::make_image_model(spec);
    if (c.model.channels_last) models::to_channels_last(*model_.module);
  }
  torch::nn::Module& module() override { return *model_.module; }
  std::string description() const override {
    return model_.description + " on " + cfg_.data.name + " (" + std::to_string(train_src_->size()) + " train / " +
           std::to_string(test_src_->size()) + " test images)";
  }
  std::int64_t train_size() const override { return train_src_->size(); }
  std::int64_t eval_size() const override { return test_src_->size(); }
  std::string metric_name(bool) const override { return "test_accuracy"; }
  torch::Tensor loss(const torch::Tensor& idx, std::uint64_t step_seed) override {
    auto aug_gen = at::make_generator<at::CPUGeneratorImpl>(step_seed ^ 0xA06);
    auto [x, y] = train_b_->batch(idx, aug_, &aug_gen);
    const Mixed mx = mix(x, y, cfg_.train, step_seed ^ 0x313);
    const torch::Tensor out = model_.forward(laid_out(mx.x));
    const auto ce = torch::nn::functional::CrossEntropyFuncOptions().label_smoothing(cfg_.train.label_smoothing);
    torch::Tensor l = torch::nn::functional::cross_entropy(out, y, ce);
    if (mx.lam < 1) l = l * mx.lam + torch::nn::functional::cross_entropy(out, mx.y2, ce) * (1 - mx.lam);
    return l;
  }
  double evaluate(bool) override {
    std::int64_t correct = 0;
    const std::int64_t n = test_src_->size();
    for (std::int64_t b = 0; b < n; b += 500) {
      auto [x, y] = test_b_->batch(torch::arange(b, std::min(n, b + 500), torch::kInt64), {}, nullptr);
      correct += model_.forward(laid_out(x)).argmax(1).eq(y).sum().item<std::int64_t>();
    }
    return 100.0 * static_cast<double>(correct) / static_cast<double>(n);
  }

 private:
  // A batch in the layout of the model's weights (model.channels_last).
  torch::Tensor laid_out(const torch::Tensor& x) const {
    return cfg_.model.channels_last ? x.contiguous(torch::MemoryFormat::ChannelsLast) : x;
  }

  settings::TrainConfig cfg_;
  std::shared_ptr<data::ImageSource> train_src_, test_src_;
  std::unique_ptr<data::ImageBatcher> train_b_, test_b_;
  data::Augment aug_;
  models::ImageModel model_;
};

}  // namespace

const Registry<DataSetInfo>& image_data_sets() {
  static const Registry<DataSetInfo> r = [] {
    DataSetInfo fashion, mnist, cifar10, cifar100, folder, synthetic;
    fashion.default_dir = data::kFashionMnistDir, fashion.load_images = load_idx;
    mnist.needs_dir = true, mnist.load_images = load_idx;
    cifar10.needs_dir = true, cifar10.load_images = load_cifar<10>;
    cifar100.needs_dir = true, cifar100.load_images = load_cifar<100>;
    folder.needs_dir = true, folder.load_images = load_folder;
    synthetic.load_images = load_synthetic;
    return Registry<DataSetInfo>("image data set", {{"fashion-mnist", fashion}, {"mnist", mnist}, {"cifar10", cifar10},
                                                    {"cifar100", cifar100}, {"folder", folder},
                                                    {"synthetic", synthetic}});
  }();
  return r;
}

std::unique_ptr<Task> make_image_task(const settings::TrainConfig& cfg) { return std::make_unique<ImageTask>(cfg); }

}  // namespace fp8lab::train
