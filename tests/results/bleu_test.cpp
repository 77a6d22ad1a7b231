// BLEU against hand-worked examples and sacreBLEU's documented behaviour (13a tokenizer
// edge cases, smoothing, brevity penalty, clipping, several references).
#include <gtest/gtest.h>

#include <cmath>

#include "../common/testutil.hpp"
#include "fp8lab/results/bleu.hpp"

using namespace fp8lab;
using results::tokenize_13a;

TEST(Tokenize13a, MtevalRules) {
  EXPECT_EQ(tokenize_13a("Hello, world!"), "Hello , world !");
  EXPECT_EQ(tokenize_13a("It costs $3.50."), "It costs $ 3.50 .");      // no split inside numbers
  EXPECT_EQ(tokenize_13a("1,000,000 people"), "1,000,000 people");
  EXPECT_EQ(tokenize_13a("e-mail and 5-3"), "e-mail and 5 - 3");         // dash only after a digit
  EXPECT_EQ(tokenize_13a("&quot;quoted&quot; &amp; &lt;b&gt;"), "\" quoted \" & < b >");
  EXPECT_EQ(tokenize_13a("<skipped> text"), "text");
  EXPECT_EQ(tokenize_13a("don't"), "don't");                             // ' is not in 13a's class
  EXPECT_EQ(tokenize_13a("end.."), "end . .");
  EXPECT_EQ(tokenize_13a("a.b,c"), "a . b , c");
  EXPECT_EQ(tokenize_13a("(x) [y] {z} a/b a:b a;b a?b a@b a#b a%b a^b a_b a`b a~b a|b"),
            "( x ) [ y ] { z } a / b a : b a ; b a ? b a @ b a # b a % b a ^ b a _ b a ` b a ~ b a | b");
  EXPECT_EQ(tokenize_13a("line-\nbreak\nhere"), "linebreak here");
  EXPECT_EQ(tokenize_13a("  many   spaces\t\there  "), "many spaces here");
  EXPECT_EQ(tokenize_13a("a\xc2\xa0" "b\xe3\x80\x80" "c"), "a b c");  // Unicode spaces split as str.split()
  EXPECT_EQ(tokenize_13a("¿Qué? «Sí», dijo."), "¿Qué ? «Sí» , dijo .");   // non-ASCII left alone
  EXPECT_EQ(tokenize_13a(""), "");
}

TEST(Bleu, Lowercase) {
  EXPECT_EQ(results::lowercase("ÁRBOL Niño DÍA ÑANDÚ ×"), "árbol niño día ñandú ×");
}

namespace {
double bleu1(const std::string& h, const std::string& r, results::BleuOptions o = {}) {
  return results::corpus_bleu({h}, {{r}}, o).score;
}
}  // namespace

TEST(Bleu, HandWorkedScores) {
  EXPECT_DOUBLE_EQ(bleu1("the cat sat on the mat", "the cat sat on the mat"), 100.0);
  // 3/4, 2/3, 1/2 and no 4-gram: exp smoothing gives the 4-gram 100 / (2 * 1) = 50;
  // (75 * 66.67 * 50 * 50)^(1/4) = 12.5e6^(1/4).
  EXPECT_NEAR(bleu1("this is a fest", "this is a test"), std::pow(12.5e6, 0.25), 1e-9);
  // sacreBLEU's raw_corpus_bleu case: floor smoothing 0.01 gives 0.01 / 1 for the 4-gram.
  results::BleuOptions floor;
  floor.smooth = results::BleuSmoothing::floor;
  floor.smooth_value = 0.01;
  floor.tokenize = results::BleuTokenizer::none;
  EXPECT_NEAR(bleu1("this is a fest", "this is a test", floor), 22.360679774997898, 1e-9);
  // No smoothing: a missing 4-gram match makes the score 0.
  results::BleuOptions none;
  none.smooth = results::BleuSmoothing::none;
  EXPECT_EQ(bleu1("this is a fest", "this is a test", none), 0.0);
  // Clipping: "the" counts at most as often as in the reference.
  const auto c = results::corpus_bleu({"the the the the"}, {{"the cat"}});
  EXPECT_DOUBLE_EQ(c.precisions[0], 25.0);
  // Brevity: 2 words against 6. Corpus BLEU has no 3-gram to count, so it is 0; with
  // effective order (sentence BLEU) it is BP * 100 = exp(1 - 6/2) * 100.
  EXPECT_EQ(bleu1("the cat", "the cat sat on the mat"), 0.0);
  results::BleuOptions eff;
  eff.effective_order = true;
  const auto b = results::corpus_bleu({"the cat"}, {{"the cat sat on the mat"}}, eff);
  EXPECT_NEAR(b.score, 100.0 * std::exp(-2.0), 1e-9);
  EXPECT_NEAR(b.bp, std::exp(-2.0), 1e-12);
  EXPECT_NEAR(b.ratio, 1.0 / 3.0, 1e-12);
  // An empty hypothesis scores 0 (brevity penalty 0), not NaN.
  EXPECT_EQ(bleu1("", "a b c d"), 0.0);
  // Case matters unless asked not to.
  EXPECT_LT(bleu1("The Cat Sat On The Mat", "the cat sat on the mat"), 100.0);
  results::BleuOptions lc;
  lc.lowercase = true;
  EXPECT_DOUBLE_EQ(bleu1("The Cat Sat On The Mat", "the cat sat on the mat", lc), 100.0);
  // Tokenization matters: "mat." is one token without 13a.
  EXPECT_DOUBLE_EQ(bleu1("the cat sat on the mat.", "the cat sat on the mat ."), 100.0);
}

TEST(Bleu, CorpusStatisticsAddUpAcrossSentences) {
  // Corpus BLEU sums n-gram statistics before taking the geometric mean: two sentences
  // of 4 words, 3 + 4 unigram matches => 7/8.
  const auto s = results::corpus_bleu({"a b c d", "e f g h"}, {{"a b c x", "e f g h"}});
  EXPECT_DOUBLE_EQ(s.precisions[0], 87.5);
  EXPECT_DOUBLE_EQ(s.precisions[1], 100.0 * 5 / 6);
  EXPECT_DOUBLE_EQ(s.precisions[2], 100.0 * 3 / 4);
  EXPECT_DOUBLE_EQ(s.precisions[3], 50.0);
  EXPECT_NEAR(s.score, std::pow(87.5 * (500.0 / 6) * 75 * 50, 0.25), 1e-9);
  EXPECT_EQ(s.sys_len, 8u);
  EXPECT_EQ(s.ref_len, 8u);
  EXPECT_EQ(s.text().rfind("BLEU = ", 0), 0u);
}

TEST(Bleu, SeveralReferences) {
  // The closest reference length (ties to the shorter) and n-gram counts maxed over refs.
  const auto s = results::corpus_bleu({"the cat is here"}, {{"the cat"}, {"a cat is here too"}, {"the dog is there"}});
  EXPECT_EQ(s.ref_len, 4u);  // |4-2|=2, |4-5|=1, |4-4|=0
  EXPECT_DOUBLE_EQ(s.precisions[0], 100.0);
  EXPECT_NE(s.signature.find("nrefs:3"), std::string::npos);
  const auto t = results::corpus_bleu({"a b c"}, {{"a b"}, {"a b c d"}});
  EXPECT_EQ(t.ref_len, 2u);  // both differ by 1: the shorter wins
}

TEST(Bleu, BadInput) {
  EXPECT_NE(test::error_of([] { results::corpus_bleu({"a", "b"}, {{"a"}}); }).find("reference stream 1 has 1"),
            std::string::npos);
  const std::string e = test::error_of([] { results::parse_bleu_smoothing("magic"); });
  EXPECT_NE(e.find("unknown BLEU smoothing 'magic' (known: exp, floor, add-k, none)"), std::string::npos) << e;
  const std::string t = test::error_of([] { results::parse_bleu_tokenizer("intl"); });
  EXPECT_NE(t.find("unknown BLEU tokenizer 'intl' (known: 13a, none)"), std::string::npos) << t;
}

// Every option's name is sacreBLEU's and parses back to it; the signature prints them.
TEST(Bleu, OptionNamesRoundTrip) {
  for (const auto s : {results::BleuSmoothing::exp, results::BleuSmoothing::floor, results::BleuSmoothing::add_k,
                       results::BleuSmoothing::none})
    EXPECT_EQ(results::parse_bleu_smoothing(results::to_string(s)), s);
  for (const auto t : {results::BleuTokenizer::t13a, results::BleuTokenizer::none})
    EXPECT_EQ(results::parse_bleu_tokenizer(results::to_string(t)), t);
  EXPECT_EQ(results::to_string(results::BleuSmoothing::add_k), "add-k");
  results::BleuOptions o;
  o.smooth = results::BleuSmoothing::add_k;
  o.tokenize = results::BleuTokenizer::none;
  EXPECT_EQ(results::corpus_bleu({"a b"}, {{"a b"}}, o).signature,
            "nrefs:1|case:mixed|eff:no|tok:none|smooth:add-k|version:fp8lab");
}
