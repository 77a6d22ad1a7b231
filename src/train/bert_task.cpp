// The BERT task: masked-language-model and next-sentence pre-training on one-sentence-per-line
// text; masked-token accuracy.
#include <filesystem>
#include <fstream>
#include <random>

#include "fp8lab/core/random.hpp"
#include "fp8lab/data/bitext.hpp"
#include "fp8lab/data/tokenizer.hpp"
#include "fp8lab/train/registry.hpp"
#include "fp8lab/models/bert.hpp"
#include "task.hpp"

namespace fp8lab::train {

namespace fs = std::filesystem;

namespace {

class BertTask final : public Task {
 public:
  explicit BertTask(const settings::TrainConfig& c) : cfg_(c) {
    const DataSetInfo& set = text_data_sets().at(c.data.name);
    const std::string dir = data_folder(text_data_sets(), c);
    const std::string train_file = (fs::path(dir) / set.train_file).string();
    const std::string dev_file = (fs::path(dir) / set.dev_file).string();
    auto train = read_lines(train_file), dev = read_lines(dev_file);
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
  // The mean over evaluation pairs of each batch's MLM + NSP loss (each batch weighted by
  // its pairs), kept as its two parts.
  double evaluate(bool) override {
    double mlm = 0, nsp = 0;
    const std::int64_t n = eval_.ids.size(0);
    for (std::int64_t b = 0; b < n; b += 128) {
      const std::int64_t e = std::min(n, b + 128);
      Batch sub{eval_.ids.slice(0, b, e), eval_.segments.slice(0, b, e), eval_.mlm_labels.slice(0, b, e),
                eval_.nsp_labels.slice(0, b, e)};
      const auto [m, s] = losses(sub);
      mlm += m.item<double>() * static_cast<double>(e - b);
      nsp += s.item<double>() * static_cast<double>(e - b);
    }
    parts_ = {{"mlm_loss", mlm / static_cast<double>(n)}, {"nsp_loss", nsp / static_cast<double>(n)}};
    return (mlm + nsp) / static_cast<double>(n);
  }
  std::vector<std::pair<std::string, double>> metric_parts() const override { return parts_; }

 private:
  struct Batch {
    torch::Tensor ids, segments, mlm_labels, nsp_labels;
  };
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
  // The masked-LM loss (mean over the predicted tokens) and the next-sentence loss.
  std::pair<torch::Tensor, torch::Tensor> losses(const Batch& b) {
    const auto [mlm, nsp] = model_->forward(b.ids, b.segments);
    const auto ce = torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-1);
    return {torch::nn::functional::cross_entropy(mlm.reshape({-1, mlm.size(-1)}), b.mlm_labels.reshape({-1}), ce),
            torch::nn::functional::cross_entropy(nsp, b.nsp_labels)};
  }
  torch::Tensor batch_loss(const Batch& b) {
    const auto [mlm, nsp] = losses(b);
    return mlm + nsp;
  }

  settings::TrainConfig cfg_;
  data::Tokenizer tok_;
  int mask_ = 0, cls_ = 0, sep_ = 0;
  std::vector<std::vector<int>> train_, dev_;
  Batch eval_;
  std::vector<std::pair<std::string, double>> parts_;  // of the last evaluation
  models::Bert model_{nullptr};
  std::string desc_;
};

}  // namespace

std::unique_ptr<Task> make_bert_task(const settings::TrainConfig& cfg) { return std::make_unique<BertTask>(cfg); }

}  // namespace fp8lab::train
