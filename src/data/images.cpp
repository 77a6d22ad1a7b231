#include "fp8lab/data/images.hpp"

#include <stb/stb_image.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>

#include "fp8lab/core/files.hpp"
#include "fp8lab/core/error.hpp"
#include "fp8lab/core/random.hpp"
#include "io.hpp"

namespace fp8lab::data {

namespace fs = std::filesystem;

namespace {


}  // namespace

ImageSet load_cifar(const std::string& dir_in, bool train, int classes) {
  if (classes != 10 && classes != 100) throw Error("CIFAR has 10 or 100 classes, not " + std::to_string(classes));
  std::vector<std::string> names;
  if (classes == 10) {
    if (train)
      for (int i = 1; i <= 5; ++i) names.push_back("data_batch_" + std::to_string(i) + ".bin");
    else
      names.push_back("test_batch.bin");
  } else {
    names.push_back(train ? "train.bin" : "test.bin");
  }
  fs::path dir = dir_in;
  const char* sub = classes == 10 ? "cifar-10-batches-bin" : "cifar-100-binary";
  if (!fs::exists(dir / names[0]) && fs::exists(dir / sub / names[0])) dir /= sub;
  std::vector<std::uint8_t> pixels, labels;
  for (const auto& n : names) {
    const std::string path = (dir / n).string();
    if (!fs::exists(path))
      throw Error(dir.string() + ": no " + n + " (expected the CIFAR-" + std::to_string(classes) +
                  " binary version, e.g. " + sub + "/)");
    io::parse_cifar(io::slurp(path), path, classes, labels, pixels);
  }
  const auto n = static_cast<std::int64_t>(labels.size());
  ImageSet s;
  s.num_classes = classes;
  s.images = torch::from_blob(pixels.data(), {n, 3, 32, 32}, torch::kUInt8).clone();
  s.labels = torch::from_blob(labels.data(), {n}, torch::kUInt8).to(torch::kInt64);
  return s;
}

ImageSet synthetic_images(std::int64_t n, std::int64_t channels, std::int64_t size, std::int64_t classes,
                          std::uint64_t seed) {
  if (n < 1 || channels < 1 || size < 1 || classes < 2) throw Error("synthetic images: bad shape");
  // The draw holds the class patterns and, per image, float32 noise, the mixed float32 image
  // and its bytes: about 13 bytes per pixel and channel.
  const double pixels = static_cast<double>(channels) * static_cast<double>(size) * static_cast<double>(size);
  const double need = pixels * (4.0 * static_cast<double>(classes) + 13.0 * static_cast<double>(n));
  if (need > static_cast<double>(memory_budget()))
    throw Error("synthetic images: " + std::to_string(n) + " images and " + std::to_string(classes) + " classes of " +
                std::to_string(channels) + "x" + std::to_string(size) + "x" + std::to_string(size) + " need about " +
                std::to_string(static_cast<long long>(need / (1 << 20))) + " MiB, more than the memory budget of " +
                std::to_string(memory_budget() >> 20) + " MiB (half the machine's memory): make the set smaller");
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const torch::Tensor patterns = torch::rand({classes, channels, size, size}, gen);
  ImageSet s;
  s.num_classes = classes;
  s.labels = torch::arange(n, torch::kInt64).remainder(classes);
  const torch::Tensor noise = torch::rand({n, channels, size, size}, gen);
  s.images = (patterns.index_select(0, s.labels) * 0.6f + noise * 0.4f).mul_(255.0f).round_().to(torch::kUInt8);
  return s;
}

Augment parse_augment(const std::string& text) {
  Augment a;
  if (text.empty() || text == "none") return a;
  std::size_t b = 0;
  while (b <= text.size()) {
    const std::size_t e = std::min(text.find('+', b), text.size());
    const std::string part = text.substr(b, e - b);
    if (part == "flip") {
      a.flip = true;
    } else if (part == "crop") {
      a.crop_padding = 4;
    } else if (part.rfind("crop:", 0) == 0) {
      try {
        std::size_t used = 0;
        a.crop_padding = std::stoi(part.substr(5), &used);
        if (used != part.size() - 5 || a.crop_padding < 0) throw std::invalid_argument("");
      } catch (const std::exception&) {
        throw Error("augment '" + text + "': bad crop padding in '" + part + "'");
      }
    } else {
      throw Error("augment '" + text + "': unknown part '" + part + "' (expected crop, crop:P, flip, none)");
    }
    b = e + 1;
  }
  return a;
}

namespace {

class MemorySource final : public ImageSource {
 public:
  explicit MemorySource(ImageSet s) : s_(std::move(s)) {
    if (!s_.images.defined() || s_.images.dim() != 4 || s_.images.scalar_type() != torch::kUInt8)
      throw Error("image set: images must be uint8 [N, C, H, W]");
  }
  std::int64_t size() const override { return s_.size(); }
  std::int64_t num_classes() const override { return s_.num_classes; }
  std::array<std::int64_t, 3> shape() const override {
    return {s_.images.size(1), s_.images.size(2), s_.images.size(3)};
  }
  std::pair<torch::Tensor, torch::Tensor> bytes(const torch::Tensor& idx) const override {
    return {s_.images.index_select(0, idx), s_.labels.index_select(0, idx)};
  }

 private:
  ImageSet s_;
};

class FolderSource final : public ImageSource {
 public:
  FolderSource(const std::string& dir, std::int64_t size) : dir_(dir), size_(size) {
    if (size < 8 || size > 1024) throw Error(dir + ": image size " + std::to_string(size) + " is not in 8..1024");
    if (!fs::is_directory(dir)) throw Error(dir + ": not a folder");
    std::vector<fs::path> classes;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.is_directory()) classes.push_back(e.path());
    std::sort(classes.begin(), classes.end());
    if (classes.size() < 2) throw Error(dir + ": an image folder needs at least two class subfolders");
    for (std::size_t c = 0; c < classes.size(); ++c) {
      std::vector<std::string> files;
      for (const auto& e : fs::directory_iterator(classes[c])) {
        std::string ext = e.path().extension().string();
        std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char ch) { return std::tolower(ch); });
        if (e.is_regular_file() && (ext == ".jpg" || ext == ".jpeg" || ext == ".png")) files.push_back(e.path().string());
      }
      if (files.empty()) throw Error(classes[c].string() + ": class folder has no .jpg/.jpeg/.png images");
      std::sort(files.begin(), files.end());
      for (auto& f : files) items_.emplace_back(std::move(f), static_cast<std::int64_t>(c));
    }
    classes_ = static_cast<std::int64_t>(classes.size());
  }
  std::int64_t size() const override { return static_cast<std::int64_t>(items_.size()); }
  std::int64_t num_classes() const override { return classes_; }
  std::array<std::int64_t, 3> shape() const override { return {3, size_, size_}; }
  std::pair<torch::Tensor, torch::Tensor> bytes(const torch::Tensor& idx_in) const override {
    const torch::Tensor idx = idx_in.contiguous();
    const std::int64_t b = idx.numel();
    torch::Tensor out = torch::empty({b, 3, size_, size_}, torch::kUInt8);
    torch::Tensor labels = torch::empty({b}, torch::kInt64);
    const auto* ip = idx.data_ptr<std::int64_t>();
    for (std::int64_t i = 0; i < b; ++i) {
      const auto& [path, label] = items_.at(static_cast<std::size_t>(ip[i]));
      out[i].copy_(load(path));
      labels[i] = label;
    }
    return {out, labels};
  }

 private:
  torch::Tensor load(const std::string& path) const {
    int w = 0, h = 0, ch = 0;
    stbi_uc* px = stbi_load(path.c_str(), &w, &h, &ch, 3);
    if (!px) throw Error(path + ": cannot decode image (" + stbi_failure_reason() + ")");
    torch::Tensor img =
        torch::from_blob(px, {h, w, 3}, torch::kUInt8).permute({2, 0, 1}).to(torch::kFloat32).unsqueeze(0);
    stbi_image_free(px);
    // Resize the shorter side to `size`, then centre-crop.
    const double s = static_cast<double>(size_) / std::min(w, h);
    const std::int64_t nh = std::max<std::int64_t>(size_, std::llround(h * s)),
                       nw = std::max<std::int64_t>(size_, std::llround(w * s));
    img = torch::nn::functional::interpolate(
        img, torch::nn::functional::InterpolateFuncOptions().size(std::vector<std::int64_t>{nh, nw}).mode(torch::kBilinear).align_corners(false));
    const std::int64_t top = (nh - size_) / 2, left = (nw - size_) / 2;
    return img[0].slice(1, top, top + size_).slice(2, left, left + size_).round().clamp(0, 255).to(torch::kUInt8);
  }
  std::string dir_;
  std::int64_t size_, classes_ = 0;
  std::vector<std::pair<std::string, std::int64_t>> items_;
};

}  // namespace

std::shared_ptr<ImageSource> memory_source(ImageSet set) { return std::make_shared<MemorySource>(std::move(set)); }

std::shared_ptr<ImageSource> image_folder_source(const std::string& dir, std::int64_t size) {
  return std::make_shared<FolderSource>(dir, size);
}

ImageBatcher::ImageBatcher(std::shared_ptr<ImageSource> source, std::vector<double> mean, std::vector<double> sd)
    : src_(std::move(source)), mean_(std::move(mean)), std_(std::move(sd)) {
  const std::int64_t c = src_->shape()[0];
  if (mean_.empty()) {
    // Per-channel statistics over (at most 10,000 images of) the source, in chunks.
    const std::int64_t n = std::min<std::int64_t>(src_->size(), 10000);
    std::vector<double> s(c, 0), s2(c, 0);
    double count = 0;
    for (std::int64_t b = 0; b < n; b += 1000) {
      const torch::Tensor x =
          src_->bytes(torch::arange(b, std::min(n, b + 1000), torch::kInt64)).first.to(torch::kFloat64).div_(255.0);
      const torch::Tensor xs = x.transpose(0, 1).reshape({c, -1});
      const torch::Tensor m = xs.sum(1), m2 = xs.pow(2).sum(1);
      for (std::int64_t k = 0; k < c; ++k) {
        s[k] += m[k].item<double>();
        s2[k] += m2[k].item<double>();
      }
      count += static_cast<double>(xs.size(1));
    }
    for (std::int64_t k = 0; k < c; ++k) {
      const double mu = s[k] / count;
      mean_.push_back(mu);
      std_.push_back(std::sqrt(std::max(1e-12, s2[k] / count - mu * mu)));
    }
  }
  if (static_cast<std::int64_t>(mean_.size()) != c || static_cast<std::int64_t>(std_.size()) != c)
    throw Error("image normalisation: " + std::to_string(mean_.size()) + " means for " + std::to_string(c) +
                " channels");
  mean_t_ = torch::tensor(std::vector<float>(mean_.begin(), mean_.end())).view({1, c, 1, 1});
  std_t_ = torch::tensor(std::vector<float>(std_.begin(), std_.end())).view({1, c, 1, 1});
}

std::pair<torch::Tensor, torch::Tensor> ImageBatcher::batch(const torch::Tensor& indices, const Augment& aug,
                                                            torch::Generator* gen) const {
  auto [b, y] = src_->bytes(indices);
  torch::Tensor x = b.to(torch::kFloat32).div_(255.0f).sub_(mean_t_).div_(std_t_);
  if ((aug.crop_padding > 0 || aug.flip) && gen) x = augment(x, aug, *gen);
  return {x, y};
}

torch::Tensor augment(const torch::Tensor& x, const Augment& aug, torch::Generator& gen) {
  const std::int64_t n = x.size(0), h = x.size(2), w = x.size(3), p = aug.crop_padding;
  const torch::Tensor offs = torch::randint(0, 2 * p + 1, {n, 2}, gen, torch::kInt64);
  const torch::Tensor flips = torch::randint(0, 2, {n}, gen, torch::kInt64);
  const torch::Tensor padded = p > 0 ? torch::constant_pad_nd(x, {p, p, p, p}, 0) : x;
  torch::Tensor out = torch::empty_like(x);
  const auto* op = offs.data_ptr<std::int64_t>();
  const auto* fp = flips.data_ptr<std::int64_t>();
  for (std::int64_t i = 0; i < n; ++i) {
    torch::Tensor img = padded[i].slice(1, op[2 * i], op[2 * i] + h).slice(2, op[2 * i + 1], op[2 * i + 1] + w);
    if (aug.flip && fp[i]) img = img.flip({2});
    out[i].copy_(img);
  }
  return out;
}

}  // namespace fp8lab::data
