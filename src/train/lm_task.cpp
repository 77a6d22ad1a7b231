// The language-model task: next-token prediction on one-sentence-per-line text read as one
// stream (each line followed by </s>), cut into blocks of the context length; validation
// perplexity.
#include <cmath>
#include <filesystem>
#include <utility>

#include "fp8lab/data/bitext.hpp"
#include "fp8lab/data/tokenizer.hpp"
#include "fp8lab/train/registry.hpp"
#include "fp8lab/models/gpt.hpp"
#include "task.hpp"

namespace fp8lab::train {

namespace fs = std::filesystem;

namespace {

// The token stream of `lines`: each line's pieces, then </s>.
torch::Tensor token_stream(const data::Tokenizer& tok, const std::vector<std::string>& lines) {
  std::vector<std::int64_t> ids;
  for (const auto& line : tok.encode(lines)) {
    ids.insert(ids.end(), line.begin(), line.end());
    ids.push_back(data::Tokenizer::kEos);
  }
  return torch::tensor(ids, torch::kInt64);
}

class LanguageModelTask final : public Task {
 public:
  explicit LanguageModelTask(const settings::TrainConfig& c) : cfg_(c), context_(c.data.max_tokens) {
    const DataSetInfo& set = text_data_sets().at(c.data.name);
    const std::string dir = data_folder(text_data_sets(), c);
    const std::string train_file = (fs::path(dir) / set.train_file).string();
    const std::string dev_file = (fs::path(dir) / set.dev_file).string();
    // Read (and so checked: regular files, not empty) before the tokenizer trains on them.
    const auto train_lines = read_lines(train_file), dev_lines = read_lines(dev_file);
    for (const auto& [file, lines] : {std::pair{&train_file, &train_lines}, std::pair{&dev_file, &dev_lines}})
      if (lines->empty()) throw Error(*file + ": no text (the language model needs lines of text in each split)");
    data::TokenizerOptions to;
    to.vocab_size = c.data.vocab_size;
    tok_ = data::Tokenizer::train_or_load(
        (fs::path(train_file).parent_path() / ("spm-lm" + std::to_string(c.data.vocab_size))).string(), {train_file}, to);
    train_ = token_stream(tok_, train_lines);
    dev_ = token_stream(tok_, dev_lines);
    train_blocks_ = blocks_in(train_, c.data.train_limit);
    dev_blocks_ = blocks_in(dev_, c.data.test_limit);
    if (train_blocks_ < 1 || dev_blocks_ < 1)
      throw Error((train_blocks_ < 1 ? train_file : dev_file) + ": fewer than " + std::to_string(context_ + 1) +
                  " tokens, not one block of data.max_tokens = " + std::to_string(context_));
    models::GptOptions o = models::gpt_preset(c.model.name);
    o.vocab = tok_.vocab_size();
    o.max_len = context_;
    if (c.model.dropout >= 0) o.dropout = c.model.dropout;
    model_ = models::Gpt(o);
    std::int64_t params = 0;
    for (const auto& p : model_->parameters()) params += p.numel();
    char buf[240];
    std::snprintf(buf, sizeof buf,
                  "%s (d %lld, %lld heads, %d layers, %s MLP %lld, context %lld, vocab %d, %.2f M parameters) on %s "
                  "(%lld train / %lld validation blocks)",
                  c.model.name.c_str(), static_cast<long long>(o.d_model), static_cast<long long>(o.heads), o.layers,
                  std::string(models::to_string(o.mlp)).c_str(), static_cast<long long>(o.d_ff),
                  static_cast<long long>(context_), tok_.vocab_size(), static_cast<double>(params) / 1e6,
                  c.data.name.c_str(), static_cast<long long>(train_blocks_), static_cast<long long>(dev_blocks_));
    desc_ = buf;
  }
  torch::nn::Module& module() override { return *model_; }
  std::string description() const override { return desc_; }
  std::int64_t train_size() const override { return train_blocks_; }
  std::int64_t eval_size() const override { return dev_blocks_; }
  std::string metric_name(bool) const override { return "val_perplexity"; }
  torch::Tensor loss(const torch::Tensor& idx, std::uint64_t) override {
    const torch::Tensor b = blocks(train_, idx);
    return next_token_loss(b, false);
  }
  // exp of the mean next-token loss over every validation token.
  double evaluate(bool) override {
    double total = 0;
    for (std::int64_t s = 0; s < dev_blocks_; s += 32) {
      const torch::Tensor idx = torch::arange(s, std::min(dev_blocks_, s + 32), torch::kInt64);
      total += next_token_loss(blocks(dev_, idx), true).item<double>();
    }
    return std::exp(total / static_cast<double>(dev_blocks_ * context_));
  }

 private:
  // Whole blocks of context + 1 tokens (inputs and their next tokens), consecutive blocks
  // sharing one token; at most `limit` (> 0).
  std::int64_t blocks_in(const torch::Tensor& stream, std::int64_t limit) const {
    const std::int64_t n = (stream.numel() - 1) / context_;
    return limit > 0 ? std::min(n, limit) : n;
  }
  torch::Tensor blocks(const torch::Tensor& stream, const torch::Tensor& idx) const {
    const torch::Tensor starts = (idx.contiguous() * context_).unsqueeze(1);        // [B, 1]
    return stream.index({starts + torch::arange(context_ + 1, torch::kInt64)});   // [B, context + 1]
  }
  // The next-token cross-entropy of blocks `b`, summed or averaged over their tokens.
  torch::Tensor next_token_loss(const torch::Tensor& b, bool sum) {
    const torch::Tensor logits = model_->forward(b.slice(1, 0, context_));
    auto options = torch::nn::functional::CrossEntropyFuncOptions();
    if (sum) options.reduction(torch::kSum);
    return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), b.slice(1, 1).reshape({-1}),
                                                options);
  }

  settings::TrainConfig cfg_;
  std::int64_t context_;
  data::Tokenizer tok_;
  torch::Tensor train_, dev_;  // token streams
  std::int64_t train_blocks_ = 0, dev_blocks_ = 0;
  models::Gpt model_{nullptr};
  std::string desc_;
};

}  // namespace

std::unique_ptr<Task> make_lm_task(const settings::TrainConfig& cfg) { return std::make_unique<LanguageModelTask>(cfg); }

}  // namespace fp8lab::train
