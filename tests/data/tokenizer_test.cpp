// SentencePiece through Debian's tools: training, caching, round trips, errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "../common/testutil.hpp"
#include "fp8lab/data/tokenizer.hpp"

using namespace fp8lab;
namespace fs = std::filesystem;

namespace {
bool have_spm() { return std::system("command -v spm_train >/dev/null 2>&1") == 0; }
fs::path corpus(const fs::path& d, int variant) {
  const fs::path p = d / ("text" + std::to_string(variant) + ".txt");
  std::ofstream o(p);
  const char* words[] = {"the", "light", "darkness", "earth", "heaven", "waters", "luz", "tierra", "cielos", "aguas"};
  for (int i = 0; i < 400; ++i) {
    for (int k = 0; k < 6; ++k) o << (k ? " " : "") << words[(i * 7 + k * 3 + variant) % 10];
    o << ".\n";
  }
  return p;
}
}  // namespace

TEST(Tokenizer, TrainsCachesAndRoundTrips) {
  if (!have_spm()) GTEST_SKIP() << "Debian's sentencepiece tools not installed";
  const fs::path d = test::temp_dir("fp8lab_spm");
  fs::remove_all(d);
  fs::create_directories(d);
  const fs::path text = corpus(d, 0);
  data::TokenizerOptions o;
  o.vocab_size = 60;
  o.user_symbols = {"[MASK]", "[CLS]"};
  auto t = data::Tokenizer::train_or_load((d / "spm").string(), {text.string()}, o);
  EXPECT_TRUE(t.trained_now());
  EXPECT_LE(t.vocab_size(), 60);
  EXPECT_GT(t.vocab_size(), 20);
  EXPECT_EQ(t.piece_id("<pad>"), data::Tokenizer::kPad);
  EXPECT_EQ(t.piece_id("</s>"), data::Tokenizer::kEos);
  EXPECT_EQ(t.piece_id("[MASK]"), 4);  // user symbols right after the four special ones
  EXPECT_EQ(t.piece_id("[CLS]"), 5);
  EXPECT_EQ(t.piece_id("no-such-piece"), data::Tokenizer::kUnk);
  const std::vector<std::string> lines = {"the light and the darkness.", "tierra luz cielos", ""};
  const auto ids = t.encode(lines);
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_FALSE(ids[0].empty());
  EXPECT_TRUE(ids[2].empty());
  for (const auto& v : ids)
    for (int i : v) EXPECT_TRUE(i > 3 && i < t.vocab_size()) << i;
  EXPECT_EQ(t.decode(ids), lines);
  // Special ids are dropped when decoding.
  std::vector<int> with = ids[1];
  with.insert(with.begin(), data::Tokenizer::kBos);
  with.push_back(data::Tokenizer::kEos);
  with.push_back(data::Tokenizer::kPad);
  EXPECT_EQ(t.decode(with), lines[1]);
  // Cached: same text and options load the model; other text retrains.
  const auto mtime = fs::last_write_time(d / "spm.model");
  auto again = data::Tokenizer::train_or_load((d / "spm").string(), {text.string()}, o);
  EXPECT_FALSE(again.trained_now());
  EXPECT_EQ(fs::last_write_time(d / "spm.model"), mtime);
  EXPECT_EQ(again.encode(lines), ids);
  auto other = data::Tokenizer::train_or_load((d / "spm").string(), {corpus(d, 1).string()}, o);
  EXPECT_TRUE(other.trained_now());
  EXPECT_TRUE(fs::exists(d / "spm.model"));
  for (const auto& e : fs::directory_iterator(d)) EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos);
}

TEST(Tokenizer, Errors) {
  if (!have_spm()) GTEST_SKIP() << "Debian's sentencepiece tools not installed";
  const fs::path d = test::temp_dir("fp8lab_spm_err");
  EXPECT_NE(test::error_of([&] { data::Tokenizer::train_or_load((d / "x").string(), {(d / "none.txt").string()}); })
                .find("none.txt: cannot open"),
            std::string::npos);
  data::TokenizerOptions o;
  o.vocab_size = 8;
  EXPECT_NE(test::error_of([&] { data::Tokenizer::train_or_load((d / "x").string(), {}, o); }).find(">= 16"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] { data::Tokenizer::load((d / "nothing.model").string()); }).find("no SentencePiece model"),
            std::string::npos);
  const fs::path text = corpus(d, 0);
  o.vocab_size = 40;
  auto t = data::Tokenizer::train_or_load((d / "ok").string(), {text.string()}, o);
  EXPECT_NE(test::error_of([&] { t.decode(std::vector<int>{100000}); }).find("outside the vocabulary"), std::string::npos);
  EXPECT_NE(test::error_of([&] { t.encode(std::string("two\nlines")); }).find("newline"), std::string::npos);
}
