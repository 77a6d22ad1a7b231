#include "fp8lab/data/tokenizer.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <system_error>

#include "fp8lab/core/error.hpp"
#include "fp8lab/core/files.hpp"
#include "fp8lab/core/text.hpp"
#include "io.hpp"

namespace fp8lab::data {

namespace fs = std::filesystem;

namespace {
constexpr int kTokenizerVersion = 1;

// FNV-1a over the inputs' bytes: the cache key of a trained model.
std::string fingerprint(const std::vector<std::string>& inputs) {
  std::uint64_t h = kFnvBasis;
  for (const auto& p : inputs) {
    regular_file_size(p);  // a FIFO or a device would never end
    std::ifstream in(p, std::ios::binary);
    if (!in) throw Error(p + ": cannot open tokenizer training text");
    char buf[1 << 16];
    while (in.read(buf, sizeof buf) || in.gcount() > 0) h = fnv1a(h, buf, static_cast<std::size_t>(in.gcount()));
  }
  return hex64(h);
}

// Runs a shell command; on failure throws Error with `what` and the end of its stderr.
void run(const std::string& cmd, const std::string& what, const std::string& err_file) {
  const int rc = std::system((cmd + " 2>" + shell_quote(err_file)).c_str());
  if (rc == 0) {
    fs::remove(err_file);
    return;
  }
  const auto bytes = io::slurp(err_file);
  std::string err(bytes.begin(), bytes.end());
  fs::remove(err_file);
  if (err.size() > 400) err = "..." + err.substr(err.size() - 400);
  if (WIFEXITED(rc) && WEXITSTATUS(rc) == 127)
    throw Error(what + ": SentencePiece tools not found (install Debian's sentencepiece package)");
  throw Error(what + " failed: " + err);
}

// A scratch file unique to this process and call, removed when it goes out of scope
// (an error on the way leaves nothing behind either).
class Scratch {
 public:
  explicit Scratch(const std::string& tag) {
    static std::atomic<int> n{0};
    path_ = (fs::temp_directory_path() / ("fp8lab_spm_" + std::to_string(::getpid()) + "_" + std::to_string(n++) + tag)).string();
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() {
    std::error_code ec;
    fs::remove(path_, ec);
    fs::remove(path_ + ".err", ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};
}  // namespace

Tokenizer Tokenizer::load(const std::string& model_path) {
  if (!fs::exists(model_path)) throw Error(model_path + ": no SentencePiece model");
  std::string vocab = model_path;
  if (vocab.size() > 6 && vocab.substr(vocab.size() - 6) == ".model") vocab = vocab.substr(0, vocab.size() - 6);
  vocab += ".vocab";
  regular_file_size(vocab);  // a FIFO or a device would never end
  std::ifstream in(vocab);
  if (!in) throw Error(vocab + ": cannot open the vocabulary next to " + model_path);
  Tokenizer t;
  t.path_ = model_path;
  std::string line;
  while (std::getline(in, line)) {
    const auto tab = line.find('\t');
    if (tab == std::string::npos) throw Error(vocab + ":" + std::to_string(t.pieces_.size() + 1) + ": expected piece<TAB>score");
    const std::string piece = line.substr(0, tab);
    t.ids_.emplace(piece, static_cast<int>(t.pieces_.size()));
    t.pieces_.push_back(piece);
  }
  if (t.pieces_.size() < 4) throw Error(vocab + ": vocabulary of " + std::to_string(t.pieces_.size()) + " pieces");
  return t;
}

Tokenizer Tokenizer::train_or_load(const std::string& prefix, const std::vector<std::string>& inputs,
                                   const TokenizerOptions& o) {
  if (o.vocab_size < 16) throw Error("tokenizer vocab_size must be >= 16, got " + std::to_string(o.vocab_size));
  if (o.model_type != "unigram" && o.model_type != "bpe")
    throw Error("tokenizer model_type '" + o.model_type + "' is not unigram or bpe");
  for (const auto& u : o.user_symbols)
    if (u.empty() || u.find_first_of(", '\t\n") != std::string::npos) throw Error("tokenizer symbol '" + u + "' is not allowed");
  nlohmann::json key = {{"version", kTokenizerVersion}, {"inputs", fingerprint(inputs)},
                        {"vocab_size", o.vocab_size}, {"model_type", o.model_type},
                        {"user_symbols", o.user_symbols}};
  const std::string model = prefix + ".model", meta = prefix + ".json";
  if (fs::exists(model) && fs::exists(meta)) {
    std::ifstream in(meta);
    const auto j = nlohmann::json::parse(in, nullptr, false);
    if (!j.is_discarded() && j == key) return load(model);
  }
  std::string files;
  for (const auto& p : inputs) files += (files.empty() ? "" : ",") + p;
  // Trained under a temporary prefix, then renamed: a killed training leaves no half model.
  const std::string tmp = prefix + ".tmp" + std::to_string(::getpid());
  if (!fs::path(prefix).parent_path().empty()) make_folder(fs::path(prefix).parent_path().string());
  std::string cmd = "spm_train --input=" + shell_quote(files) + " --model_prefix=" + shell_quote(tmp) +
                    " --vocab_size=" + std::to_string(o.vocab_size) + " --model_type=" + o.model_type +
                    " --character_coverage=1.0 --pad_id=0 --unk_id=1 --bos_id=2 --eos_id=3"
                    " --input_sentence_size=0 --num_threads=2 --minloglevel=2 --hard_vocab_limit=false";
  if (!o.user_symbols.empty()) {
    std::string s;
    for (const auto& u : o.user_symbols) s += (s.empty() ? "" : ",") + u;
    cmd += " --user_defined_symbols=" + shell_quote(s);
  }
  run(cmd + " >/dev/null", prefix + ": SentencePiece training", tmp + ".err");
  fs::rename(tmp + ".vocab", prefix + ".vocab");
  fs::rename(tmp + ".model", model);
  const std::string k = key.dump(2) + "\n";
  write_file_atomic(meta, k.data(), k.size());  // last: marks the cached model complete
  Tokenizer t = load(model);
  t.trained_now_ = true;
  return t;
}

std::vector<std::vector<int>> Tokenizer::encode(const std::vector<std::string>& lines) const {
  const Scratch in_file(".txt"), out_file(".ids");
  const std::string& in = in_file.path();
  const std::string& out = out_file.path();
  {
    std::ofstream f(in, std::ios::binary);
    for (const auto& l : lines) {
      if (l.find('\n') != std::string::npos) throw Error("tokenizer: a line to encode contains a newline");
      f << l << '\n';
    }
  }
  run("spm_encode --model=" + shell_quote(path_) + " --output_format=id < " + shell_quote(in) + " > " + shell_quote(out),
      "spm_encode", out + ".err");
  std::ifstream f(out);
  std::vector<std::vector<int>> ids;
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream ss(line);
    std::vector<int> v;
    int x;
    while (ss >> x) v.push_back(x);
    ids.push_back(std::move(v));
  }
  if (ids.size() != lines.size())
    throw Error("spm_encode returned " + std::to_string(ids.size()) + " lines for " + std::to_string(lines.size()));
  return ids;
}

std::vector<std::string> Tokenizer::decode(const std::vector<std::vector<int>>& ids) const {
  const Scratch in_file(".ids"), out_file(".txt");
  const std::string& in = in_file.path();
  const std::string& out = out_file.path();
  {
    std::ofstream f(in, std::ios::binary);
    for (const auto& v : ids) {
      bool first = true;
      for (int i : v)
        if (i != kPad && i != kBos && i != kEos) {
          if (i < 0 || i >= vocab_size()) throw Error("tokenizer: id " + std::to_string(i) + " is outside the vocabulary");
          f << (first ? "" : " ") << i;
          first = false;
        }
      f << '\n';
    }
  }
  run("spm_decode --model=" + shell_quote(path_) + " --input_format=id < " + shell_quote(in) + " > " + shell_quote(out), "spm_decode",
      out + ".err");
  std::ifstream f(out);
  std::vector<std::string> text;
  std::string line;
  while (std::getline(f, line)) text.push_back(line);
  // spm_decode writes nothing for a trailing empty line; an empty hypothesis is "".
  while (text.size() < ids.size()) text.emplace_back();
  return text;
}

int Tokenizer::piece_id(const std::string& piece) const {
  const auto it = ids_.find(piece);
  return it == ids_.end() ? kUnk : it->second;
}

}  // namespace fp8lab::data
