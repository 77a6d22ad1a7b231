// The tasks: image classification and translation.
#include <filesystem>
#include <fstream>
#include <random>

#include "fp8lab/core/random.hpp"
#include "fp8lab/data/images.hpp"
#include "fp8lab/data/parallel.hpp"
#include "fp8lab/data/tokenizer.hpp"
#include "fp8lab/models/bert.hpp"
#include "fp8lab/models/image_models.hpp"
#include "fp8lab/models/transformer.hpp"
#include "fp8lab/results/bleu.hpp"
#include "task.hpp"

namespace fp8lab::experiments {

namespace fs = std::filesystem;

namespace {

// ===== image classification =================================================================

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

std::pair<std::shared_ptr<data::ImageSource>, std::shared_ptr<data::ImageSource>> load_images(const TrainConfig& c) {
  const auto& d = c.data;
  std::shared_ptr<data::ImageSource> tr, te;
  if (d.name == "fashion-mnist" || d.name == "mnist") {
    const std::string dir = d.dir.empty() ? data::kFashionMnistDir : d.dir;
    tr = data::memory_source(data::load_mnist_folder(dir, true));
    te = data::memory_source(data::load_mnist_folder(dir, false));
  } else if (d.name == "cifar10" || d.name == "cifar100") {
    const int k = d.name == "cifar10" ? 10 : 100;
    tr = data::memory_source(data::load_cifar(d.dir, true, k));
    te = data::memory_source(data::load_cifar(d.dir, false, k));
  } else if (d.name == "folder") {
    const std::int64_t size = d.image_size > 0 ? d.image_size : 224;
    tr = data::image_folder_source((fs::path(d.dir) / "train").string(), size);
    const fs::path val = fs::exists(fs::path(d.dir) / "val") ? fs::path(d.dir) / "val" : fs::path(d.dir) / "test";
    te = data::image_folder_source(val.string(), size);
    if (te->num_classes() != tr->num_classes())
      throw Error(val.string() + ": " + std::to_string(te->num_classes()) + " classes but train has " +
                  std::to_string(tr->num_classes()));
  } else {  // synthetic: one draw split in two, so both halves share the class patterns
    const std::int64_t size = d.image_size > 0 ? d.image_size : 16;
    data::ImageSet all = data::synthetic_images(d.synthetic_train + d.synthetic_test, d.synthetic_channels, size,
                                                d.synthetic_classes, c.seed ^ 0x5eed);
    data::ImageSet a = all, b = all;
    a.images = all.images.slice(0, 0, d.synthetic_train).clone();
    a.labels = all.labels.slice(0, 0, d.synthetic_train).clone();
    b.images = all.images.slice(0, d.synthetic_train).clone();
    b.labels = all.labels.slice(0, d.synthetic_train).clone();
    tr = data::memory_source(a);
    te = data::memory_source(b);
  }
  if (d.train_limit > 0) tr = std::make_shared<PrefixSource>(tr, d.train_limit);
  if (d.test_limit > 0) te = std::make_shared<PrefixSource>(te, d.test_limit);
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

Mixed mix(const torch::Tensor& x, const torch::Tensor& y, const TrainLoopConfig& t, std::uint64_t seed) {
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
  explicit ImageTask(const TrainConfig& c) : cfg_(c) {
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
    model_ = models::make_image_model(spec);
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
    const torch::Tensor out = model_.forward(mx.x);
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
      correct += model_.forward(x).argmax(1).eq(y).sum().item<std::int64_t>();
    }
    return 100.0 * static_cast<double>(correct) / static_cast<double>(n);
  }

 private:
  TrainConfig cfg_;
  std::shared_ptr<data::ImageSource> train_src_, test_src_;
  std::unique_ptr<data::ImageBatcher> train_b_, test_b_;
  data::Augment aug_;
  models::ImageModel model_;
};

// ===== translation =========================================================================

// Token ids of one side, with bos/eos, truncated to max_len.
std::vector<int> with_ends(std::vector<int> ids, int max_len) {
  if (static_cast<int>(ids.size()) > max_len - 2) ids.resize(static_cast<std::size_t>(max_len - 2));
  ids.insert(ids.begin(), data::Tokenizer::kBos);
  ids.push_back(data::Tokenizer::kEos);
  return ids;
}

torch::Tensor pad_batch(const std::vector<const std::vector<int>*>& rows, std::size_t skip_front = 0, std::size_t skip_back = 0) {
  std::size_t len = 1;
  for (const auto* r : rows) len = std::max(len, r->size() - skip_front - skip_back);
  torch::Tensor t = torch::zeros({static_cast<std::int64_t>(rows.size()), static_cast<std::int64_t>(len)}, torch::kInt64);
  auto* p = t.data_ptr<std::int64_t>();
  for (std::size_t i = 0; i < rows.size(); ++i)
    for (std::size_t k = skip_front; k + skip_back < rows[i]->size(); ++k) p[i * len + (k - skip_front)] = (*rows[i])[k];
  return t;
}

class TranslationTask final : public Task {
 public:
  explicit TranslationTask(const TrainConfig& c) : cfg_(c) {
    std::string dir = c.data.dir;
    if (c.data.name == "bible-en-es") {
      if (dir.empty()) dir = "data/bible-en-es";
      data::prepare_bible_corpus(dir);
    }
    const std::string s = c.data.src_lang, t = c.data.tgt_lang;
    auto train = data::read_parallel((fs::path(dir) / "train").string(), s, t);
    auto dev = data::read_parallel((fs::path(dir) / "dev").string(), s, t);
    auto test = data::read_parallel((fs::path(dir) / "test").string(), s, t);
    if (c.data.train_limit > 0 && c.data.train_limit < static_cast<std::int64_t>(train.first.size())) {
      train.first.resize(static_cast<std::size_t>(c.data.train_limit));
      train.second.resize(static_cast<std::size_t>(c.data.train_limit));
    }
    for (auto* split : {&dev, &test})
      if (c.data.test_limit > 0 && c.data.test_limit < static_cast<std::int64_t>(split->first.size())) {
        split->first.resize(static_cast<std::size_t>(c.data.test_limit));
        split->second.resize(static_cast<std::size_t>(c.data.test_limit));
      }
    // One joint vocabulary over both sides of the (whole) training split, cached.
    data::TokenizerOptions to;
    to.vocab_size = c.data.vocab_size;
    tok_ = data::Tokenizer::train_or_load((fs::path(dir) / ("spm" + std::to_string(c.data.vocab_size))).string(),
                                          {(fs::path(dir) / ("train." + s)).string(), (fs::path(dir) / ("train." + t)).string()},
                                          to);
    const int max_len = c.data.max_tokens;
    for (auto& ids : tok_.encode(train.first)) src_.push_back(with_ends(std::move(ids), max_len));
    for (auto& ids : tok_.encode(train.second)) tgt_.push_back(with_ends(std::move(ids), max_len));
    for (auto& ids : tok_.encode(dev.first)) dev_src_.push_back(with_ends(std::move(ids), max_len));
    for (auto& ids : tok_.encode(test.first)) test_src_.push_back(with_ends(std::move(ids), max_len));
    dev_ = std::move(dev);
    test_ = std::move(test);
    models::TransformerOptions o = models::transformer_preset(c.model.name);
    o.vocab = tok_.vocab_size();
    if (c.model.dropout >= 0) o.dropout = c.model.dropout;
    o.max_len = std::max<std::int64_t>(o.max_len, max_len);
    model_ = models::Transformer(o);
    std::int64_t params = 0;
    for (const auto& p : model_->parameters()) params += p.numel();
    char buf[160];
    std::snprintf(buf, sizeof buf, "%s (d %lld, %lld heads, %d+%d layers, vocab %d, %.2f M parameters)",
                  c.model.name.c_str(), static_cast<long long>(o.d_model), static_cast<long long>(o.heads),
                  o.encoder_layers, o.decoder_layers, tok_.vocab_size(), static_cast<double>(params) / 1e6);
    desc_ = buf;
  }
  torch::nn::Module& module() override { return *model_; }
  std::string description() const override {
    return desc_ + " on " + cfg_.data.name + " " + cfg_.data.src_lang + "->" + cfg_.data.tgt_lang + " (" +
           std::to_string(src_.size()) + " train pairs, " + std::to_string(dev_.first.size()) + " dev, " +
           std::to_string(test_.first.size()) + " test)";
  }
  std::int64_t train_size() const override { return static_cast<std::int64_t>(src_.size()); }
  std::int64_t eval_size() const override { return static_cast<std::int64_t>(dev_.first.size()); }
  std::string metric_name(bool final) const override { return final ? "test_bleu" : "dev_bleu"; }
  bool separate_final() const override { return true; }
  torch::Tensor loss(const torch::Tensor& idx_in, std::uint64_t) override {
    const torch::Tensor idx = idx_in.contiguous();
    std::vector<const std::vector<int>*> s, t;
    for (std::int64_t i = 0; i < idx.numel(); ++i) {
      const auto k = static_cast<std::size_t>(idx.data_ptr<std::int64_t>()[i]);
      s.push_back(&src_[k]);
      t.push_back(&tgt_[k]);
    }
    const torch::Tensor src = pad_batch(s), tgt_in = pad_batch(t, 0, 1), tgt_out = pad_batch(t, 1, 0);
    const torch::Tensor logits = model_->forward(src, tgt_in);
    return torch::nn::functional::cross_entropy(
        logits.reshape({-1, logits.size(-1)}), tgt_out.reshape({-1}),
        torch::nn::functional::CrossEntropyFuncOptions().ignore_index(0).label_smoothing(cfg_.train.label_smoothing));
  }
  double evaluate(bool final) override {
    const auto& split = final ? test_ : dev_;
    const auto& rows = final ? test_src_ : dev_src_;
    std::vector<std::vector<int>> out_ids;
    const std::size_t B = 64;
    for (std::size_t b = 0; b < rows.size(); b += B) {
      std::vector<const std::vector<int>*> ptrs;
      for (std::size_t i = b; i < std::min(rows.size(), b + B); ++i) ptrs.push_back(&rows[i]);
      const torch::Tensor src = pad_batch(ptrs);
      // Outputs up to 1.5x the longest source plus 10 tokens (never beyond max_tokens): an
      // untrained model that never says </s> must not decode max_tokens steps every time.
      std::size_t longest = 0;
      for (const auto* p : ptrs) longest = std::max(longest, p->size());
      const int max_out = std::min<int>(cfg_.data.max_tokens, static_cast<int>(longest * 3 / 2 + 10));
      const auto out = cfg_.train.beam > 1
                           ? model_->beam_search(src, cfg_.train.beam, max_out, data::Tokenizer::kBos, data::Tokenizer::kEos)
                           : model_->greedy(src, max_out, data::Tokenizer::kBos, data::Tokenizer::kEos);
      for (const auto& ids : out) out_ids.push_back(ids);
    }
    const std::vector<std::string> hyps = tok_.decode(out_ids);
    results::BleuOptions bo;
    bo.lowercase = cfg_.train.bleu_lowercase;
    return results::corpus_bleu(hyps, {split.second}, bo).score;
  }

 private:
  TrainConfig cfg_;
  data::Tokenizer tok_;
  std::vector<std::vector<int>> src_, tgt_, dev_src_, test_src_;
  std::pair<std::vector<std::string>, std::vector<std::string>> dev_, test_;
  models::Transformer model_{nullptr};
  std::string desc_;
};

// ===== BERT pre-training: masked language model + next-sentence prediction ====================

class BertTask final : public Task {
 public:
  explicit BertTask(const TrainConfig& c) : cfg_(c) {
    std::string dir = c.data.dir, train_file, dev_file;
    if (c.data.name == "bible-en") {
      if (dir.empty()) dir = "data/bible-en-es";
      data::prepare_bible_corpus(dir);
      train_file = (fs::path(dir) / "train.en").string();
      dev_file = (fs::path(dir) / "dev.en").string();
    } else {  // text: train.txt and dev.txt, one sentence per line, in document order
      train_file = (fs::path(dir) / "train.txt").string();
      dev_file = (fs::path(dir) / "dev.txt").string();
    }
    auto train = read_text(train_file), dev = read_text(dev_file);
    if (c.data.train_limit > 0 && c.data.train_limit < static_cast<std::int64_t>(train.size()))
      train.resize(static_cast<std::size_t>(c.data.train_limit));
    if (train.size() < 2 || dev.size() < 2) throw Error(train_file + ": BERT needs at least two sentences per split");
    data::TokenizerOptions to;
    to.vocab_size = c.data.vocab_size;
    to.user_symbols = {"[MASK]", "[CLS]", "[SEP]"};
    tok_ = data::Tokenizer::train_or_load(
        (fs::path(train_file).parent_path() / ("spm-bert" + std::to_string(c.data.vocab_size))).string(), {train_file}, to);
    mask_ = tok_.piece_id("[MASK]");
    cls_ = tok_.piece_id("[CLS]");
    sep_ = tok_.piece_id("[SEP]");
    train_ = tok_.encode(train);
    dev_ = tok_.encode(dev);
    models::BertOptions o = models::bert_preset(c.model.name);
    o.vocab = tok_.vocab_size();
    o.max_len = c.data.max_tokens;
    if (c.model.dropout >= 0) o.dropout = c.model.dropout;
    model_ = models::Bert(o);
    // A fixed evaluation set: pairs and masks drawn once from the dev sentences.
    std::int64_t n_eval = static_cast<std::int64_t>(dev_.size()) - 1;
    if (c.data.test_limit > 0) n_eval = std::min(n_eval, c.data.test_limit);
    eval_ = make_batch(dev_, torch::arange(n_eval, torch::kInt64), 0xE7A1);
    std::int64_t params = 0;
    for (const auto& p : model_->parameters()) params += p.numel();
    char buf[200];
    std::snprintf(buf, sizeof buf, "%s (hidden %lld, %lld heads, %d layers, vocab %d, %.2f M parameters) on %s (%zu train / %lld eval sentence pairs)",
                  c.model.name.c_str(), static_cast<long long>(o.hidden), static_cast<long long>(o.heads), o.layers,
                  tok_.vocab_size(), static_cast<double>(params) / 1e6, c.data.name.c_str(), train_.size() - 1,
                  static_cast<long long>(n_eval));
    desc_ = buf;
  }
  torch::nn::Module& module() override { return *model_; }
  std::string description() const override { return desc_; }
  std::int64_t train_size() const override { return static_cast<std::int64_t>(train_.size()) - 1; }
  std::int64_t eval_size() const override { return eval_.ids.size(0); }
  std::string metric_name(bool) const override { return "mlm_nsp_loss"; }
  torch::Tensor loss(const torch::Tensor& idx, std::uint64_t step_seed) override {
    return batch_loss(make_batch(train_, idx, step_seed));
  }
  double evaluate(bool) override {
    double total = 0;
    const std::int64_t n = eval_.ids.size(0);
    for (std::int64_t b = 0; b < n; b += 128) {
      const std::int64_t e = std::min(n, b + 128);
      Batch sub{eval_.ids.slice(0, b, e), eval_.segments.slice(0, b, e), eval_.mlm_labels.slice(0, b, e),
                eval_.nsp_labels.slice(0, b, e)};
      total += batch_loss(sub).item<double>() * static_cast<double>(e - b);
    }
    return total / static_cast<double>(n);
  }

 private:
  struct Batch {
    torch::Tensor ids, segments, mlm_labels, nsp_labels;
  };
  static std::vector<std::string> read_text(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw Error(path + ": cannot open");
    std::vector<std::string> lines;
    std::string l;
    while (std::getline(in, l))
      if (!l.empty()) lines.push_back(l);
    return lines;
  }
  // Example i: sentence i, then sentence i+1 (is_next) or a random other sentence, as
  // [CLS] A [SEP] B [SEP]; 15 % of the A/B tokens are predicted: 80 % of them replaced by
  // [MASK], 10 % by a random token, 10 % kept. Deterministic in `seed`.
  Batch make_batch(const std::vector<std::vector<int>>& sents, const torch::Tensor& idx_in, std::uint64_t seed) const {
    const torch::Tensor idx = idx_in.contiguous();
    const std::int64_t B = idx.numel(), L = cfg_.data.max_tokens;
    std::mt19937_64 rng(seed);
    std::vector<std::vector<int>> rows(B), segs(B), labels(B);
    std::vector<std::int64_t> nsp(B);
    std::size_t longest = 0;
    const auto n = sents.size();
    const int half = static_cast<int>((L - 3) / 2);
    for (std::int64_t b = 0; b < B; ++b) {
      const auto i = static_cast<std::size_t>(idx.data_ptr<std::int64_t>()[b]);
      const bool is_next = rng() & 1;
      std::size_t j = i + 1;
      if (!is_next) {
        j = static_cast<std::size_t>(rng() % n);
        if (j == i + 1 || j == i) j = (i + 2 + j) % n;
      }
      nsp[b] = is_next ? 1 : 0;
      std::vector<int> a = sents[i], c = sents[j];
      if (static_cast<int>(a.size()) > half) a.resize(static_cast<std::size_t>(half));
      if (static_cast<int>(c.size()) > static_cast<int>(L) - 3 - static_cast<int>(a.size()))
        c.resize(static_cast<std::size_t>(L - 3 - static_cast<std::int64_t>(a.size())));
      auto& r = rows[b];
      auto& s = segs[b];
      r.push_back(cls_);
      s.push_back(0);
      for (int t : a) r.push_back(t), s.push_back(0);
      r.push_back(sep_);
      s.push_back(0);
      for (int t : c) r.push_back(t), s.push_back(1);
      r.push_back(sep_);
      s.push_back(1);
      auto& lab = labels[b];
      lab.assign(r.size(), -1);
      for (std::size_t k = 0; k < r.size(); ++k) {
        if (r[k] == cls_ || r[k] == sep_) continue;
        if (rng() % 100 >= 15) continue;
        lab[k] = r[k];
        const auto u = rng() % 10;
        if (u < 8) r[k] = mask_;
        else if (u == 8) r[k] = 6 + static_cast<int>(rng() % static_cast<std::uint64_t>(tok_.vocab_size() - 6));
      }
      longest = std::max(longest, r.size());
    }
    Batch out;
    const auto Lb = static_cast<std::int64_t>(longest);
    out.ids = torch::zeros({B, Lb}, torch::kInt64);
    out.segments = torch::zeros({B, Lb}, torch::kInt64);
    out.mlm_labels = torch::full({B, Lb}, -1, torch::kInt64);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::size_t k = 0; k < rows[b].size(); ++k) {
        const auto kk = static_cast<std::int64_t>(k);
        out.ids[b][kk] = rows[b][k];
        out.segments[b][kk] = segs[b][k];
        out.mlm_labels[b][kk] = labels[b][k];
      }
    out.nsp_labels = torch::tensor(nsp, torch::kInt64);
    return out;
  }
  torch::Tensor batch_loss(const Batch& b) {
    const auto [mlm, nsp] = model_->forward(b.ids, b.segments);
    const auto ce = torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-1);
    return torch::nn::functional::cross_entropy(mlm.reshape({-1, mlm.size(-1)}), b.mlm_labels.reshape({-1}), ce) +
           torch::nn::functional::cross_entropy(nsp, b.nsp_labels);
  }

  TrainConfig cfg_;
  data::Tokenizer tok_;
  int mask_ = 0, cls_ = 0, sep_ = 0;
  std::vector<std::vector<int>> train_, dev_;
  Batch eval_;
  models::Bert model_{nullptr};
  std::string desc_;
};

}  // namespace

std::unique_ptr<Task> make_task(const TrainConfig& cfg) {
  if (cfg.task == "translation") return std::make_unique<TranslationTask>(cfg);
  if (cfg.task == "bert") return std::make_unique<BertTask>(cfg);
  return std::make_unique<ImageTask>(cfg);
}

}  // namespace fp8lab::experiments
