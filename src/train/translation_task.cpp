// The translation task: a Transformer encoder-decoder on a parallel corpus; BLEU.
#include <filesystem>
#include <fstream>
#include <random>

#include "fp8lab/core/random.hpp"
#include "fp8lab/data/bitext.hpp"
#include "fp8lab/data/tokenizer.hpp"
#include "fp8lab/train/registry.hpp"
#include "fp8lab/models/transformer.hpp"
#include "fp8lab/results/bleu.hpp"
#include "task.hpp"

namespace fp8lab::train {

namespace fs = std::filesystem;

namespace {

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
  explicit TranslationTask(const settings::TrainConfig& c) : cfg_(c) {
    const std::string dir = data_folder(translation_data_sets(), c);
    const std::string s = c.data.src_lang, t = c.data.tgt_lang;
    auto train = data::read_bitext((fs::path(dir) / "train").string(), s, t);
    auto dev = data::read_bitext((fs::path(dir) / "dev").string(), s, t);
    auto test = data::read_bitext((fs::path(dir) / "test").string(), s, t);
    // One joint vocabulary over both sides of the (whole) training split, cached.
    data::TokenizerOptions to;
    to.vocab_size = c.data.vocab_size;
    tok_ = data::Tokenizer::train_or_load((fs::path(dir) / ("spm" + std::to_string(c.data.vocab_size))).string(),
                                          {(fs::path(dir) / ("train." + s)).string(), (fs::path(dir) / ("train." + t)).string()},
                                          to);
    const int max_len = c.data.max_tokens;
    auto train_ids = encode_pairs(train, max_len, c.data.drop_long, c.data.train_limit);
    auto dev_ids = encode_pairs(dev, max_len, c.data.drop_long, c.data.test_limit);
    auto test_ids = encode_pairs(test, max_len, c.data.drop_long, c.data.test_limit);
    for (const auto& [name, ids] : {std::pair{"train", &train_ids}, {"dev", &dev_ids}, {"test", &test_ids}})
      if (c.data.drop_long && ids->first.empty())
        throw Error("data.drop_long: no pair of " + (fs::path(dir) / name).string() + ".{" + s + "," + t +
                    "} has both sides within data.max_tokens = " + std::to_string(max_len) + " tokens");
    src_ = std::move(train_ids.first);
    tgt_ = std::move(train_ids.second);
    dev_src_ = std::move(dev_ids.first);
    test_src_ = std::move(test_ids.first);
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
      for (const auto& ids : decode(src, max_out)) out_ids.push_back(ids);
    }
    hyps_ = tok_.decode(out_ids);
    results::BleuOptions bo;
    bo.lowercase = cfg_.train.bleu_lowercase;
    return results::corpus_bleu(hyps_, {split.second}, bo).score;
  }
  void use_reference_decoding(bool on) override { reference_ = on; }
  std::vector<std::string> outputs() const override { return hyps_; }

 private:
  // The token ids of a split's sides, each with bos/eos and truncated to max_len, or, with
  // `drop`, without the pairs that have a side longer than max_len (the split's text loses
  // them too); then the first `limit` pairs (0: all).
  std::pair<std::vector<std::vector<int>>, std::vector<std::vector<int>>> encode_pairs(
      std::pair<std::vector<std::string>, std::vector<std::string>>& split, int max_len, bool drop,
      std::int64_t limit) const {
    auto src = tok_.encode(split.first), tgt = tok_.encode(split.second);
    std::pair<std::vector<std::vector<int>>, std::vector<std::vector<int>>> out;
    std::pair<std::vector<std::string>, std::vector<std::string>> kept;
    for (std::size_t i = 0; i < src.size(); ++i) {
      if (limit > 0 && static_cast<std::int64_t>(out.first.size()) >= limit) break;
      const auto too_long = [&](const std::vector<int>& ids) { return static_cast<int>(ids.size()) + 2 > max_len; };
      if (drop && (too_long(src[i]) || too_long(tgt[i]))) continue;
      out.first.push_back(with_ends(std::move(src[i]), max_len));
      out.second.push_back(with_ends(std::move(tgt[i]), max_len));
      kept.first.push_back(std::move(split.first[i]));
      kept.second.push_back(std::move(split.second[i]));
    }
    split = std::move(kept);
    return out;
  }

  // Greedy (beam 1) or beam search, with the decoder cache or the reference decoders.
  std::vector<std::vector<int>> decode(const torch::Tensor& src, int max_out) {
    const int beam = cfg_.train.beam, bos = data::Tokenizer::kBos, eos = data::Tokenizer::kEos;
    if (reference_)
      return beam > 1 ? model_->beam_search_reference(src, beam, max_out, bos, eos)
                      : model_->greedy_reference(src, max_out, bos, eos);
    return beam > 1 ? model_->beam_search(src, beam, max_out, bos, eos) : model_->greedy(src, max_out, bos, eos);
  }

  settings::TrainConfig cfg_;
  bool reference_ = false;
  std::vector<std::string> hyps_;  // of the last evaluation
  data::Tokenizer tok_;
  std::vector<std::vector<int>> src_, tgt_, dev_src_, test_src_;
  std::pair<std::vector<std::string>, std::vector<std::string>> dev_, test_;
  models::Transformer model_{nullptr};
  std::string desc_;
};

void prepare_bible(const std::string& dir) { data::prepare_bible_corpus(dir); }

}  // namespace

const Registry<DataSetInfo>& translation_data_sets() {
  static const Registry<DataSetInfo> r = [] {
    DataSetInfo bible, parallel;
    bible.default_dir = "data/bible-en-es", bible.prepare = prepare_bible;
    parallel.needs_dir = true;
    return Registry<DataSetInfo>("translation corpus", {{"bible-en-es", bible}, {"parallel", parallel}});
  }();
  return r;
}

std::unique_ptr<Task> make_translation_task(const settings::TrainConfig& cfg) { return std::make_unique<TranslationTask>(cfg); }

}  // namespace fp8lab::train
