// Subword tokenization with SentencePiece: a model trained by the tool on the training
// text and cached next to it, so later runs load it.
//
// SentencePiece runs as Debian's command-line tools (package `sentencepiece`: spm_train,
// spm_encode, spm_decode), not linked in: Debian's libsentencepiece.so embeds and exports
// its own copy of protobuf-lite, which interposes on the libprotobuf that libtorch loads
// and crashes the process during static initialisation. Text goes through the tools in
// batches (a whole corpus or evaluation set per call), so the process boundary costs
// little.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace fp8lab::data {

struct TokenizerOptions {
  int vocab_size = 8000;
  std::string model_type = "unigram";  // unigram or bpe
  // Extra symbols with ids of their own, after the four special ones (e.g. "[MASK]",
  // "[CLS]", "[SEP]" for BERT).
  std::vector<std::string> user_symbols;
};

// Ids 0..3 are pad, unk, bos (<s>), eos (</s>).
class Tokenizer {
 public:
  static constexpr int kPad = 0, kUnk = 1, kBos = 2, kEos = 3;

  // Loads `prefix`.model when it was trained on the same files with the same options
  // (recorded in `prefix`.json); otherwise trains it on `inputs` (text files, one sentence
  // per line) and writes the model atomically. Errors name the file.
  static Tokenizer train_or_load(const std::string& prefix, const std::vector<std::string>& inputs,
                                 const TokenizerOptions& o = {});
  static Tokenizer load(const std::string& model_path);

  // One call of spm_encode / spm_decode per batch. Lines must not contain newlines.
  std::vector<std::vector<int>> encode(const std::vector<std::string>& lines) const;
  std::vector<std::string> decode(const std::vector<std::vector<int>>& ids) const;  // pad/bos/eos skipped
  std::vector<int> encode(const std::string& line) const { return encode(std::vector<std::string>{line})[0]; }
  std::string decode(const std::vector<int>& ids) const { return decode(std::vector<std::vector<int>>{ids})[0]; }
  int piece_id(const std::string& piece) const;  // kUnk if absent
  int vocab_size() const { return static_cast<int>(pieces_.size()); }
  const std::string& model_path() const { return path_; }
  bool trained_now() const { return trained_now_; }

 private:
  std::string path_;
  std::map<std::string, int> ids_;
  std::vector<std::string> pieces_;
  bool trained_now_ = false;
};

}  // namespace fp8lab::data
