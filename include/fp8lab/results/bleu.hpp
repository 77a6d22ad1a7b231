// Corpus BLEU compatible with sacreBLEU (Post 2018): the 13a tokenizer of mteval-v13a, n-gram
// orders 1..4, the brevity penalty against the closest reference length, and sacreBLEU's
// smoothing methods ("exp" by default for corpus BLEU). Text is UTF-8; all of 13a's
// patterns are ASCII, so the byte-wise implementation matches sacreBLEU's code-point regexes.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace fp8lab::results {

// mteval-v13a tokenization as sacreBLEU's `13a` tokenizer does it.
std::string tokenize_13a(std::string_view line);

// Lower-casing as sacreBLEU's `lowercase=True`: ASCII and Latin-1 letters (what English and
// Spanish use); other scripts are left as they are.
std::string lowercase(std::string_view s);

struct BleuStats {
  std::array<std::uint64_t, 4> correct{}, total{};
  std::uint64_t sys_len = 0, ref_len = 0;
  BleuStats& operator+=(const BleuStats& o);
};

struct BleuScore {
  double score = 0;                  // 0..100
  std::array<double, 4> precisions{};  // percent, after smoothing
  double bp = 0;                     // brevity penalty
  double ratio = 0;                  // sys_len / ref_len
  std::uint64_t sys_len = 0, ref_len = 0;
  std::string signature;             // e.g. "nrefs:1|case:lc|eff:no|tok:13a|smooth:exp|version:fp8lab"
  std::string text() const;          // "BLEU = 27.31 58.4/33.0/20.6/13.1 (BP = 1.000 ratio = 1.012 hyp_len = ... ref_len = ...)"
};

// sacreBLEU's tokenizers that fp8lab has: `13a`, and `none` (the text as it is).
enum class BleuTokenizer { t13a, none };
// sacreBLEU's smoothing methods: `exp` (corpus BLEU's default), `floor`, `add-k`, `none`.
enum class BleuSmoothing { exp, floor, add_k, none };

// Their names as sacreBLEU writes them (and its signatures print them); the parsers take
// those names and refuse any other, naming the ones there are.
std::string_view to_string(BleuTokenizer t);
std::string_view to_string(BleuSmoothing s);
BleuTokenizer parse_bleu_tokenizer(std::string_view name);
BleuSmoothing parse_bleu_smoothing(std::string_view name);

struct BleuOptions {
  bool lowercase = false;
  BleuTokenizer tokenize = BleuTokenizer::t13a;
  BleuSmoothing smooth = BleuSmoothing::exp;
  double smooth_value = 0;       // floor: 0.1 by default; add-k: 1 by default (0: the default)
  bool effective_order = false;  // sacreBLEU uses it for sentence BLEU
};

// Statistics of one hypothesis against its references (already tokenized and cased).
BleuStats bleu_stats(std::string_view hyp, const std::vector<std::string_view>& refs);
BleuScore bleu_from_stats(const BleuStats& s, const BleuOptions& o = {}, std::size_t nrefs = 1);

// Corpus BLEU: hyps[i] against refs[k][i] for every reference stream k (as sacreBLEU's
// corpus_score(hyps, [refs_1, refs_2, ...])). Throws Error if a stream's length differs.
BleuScore corpus_bleu(const std::vector<std::string>& hyps, const std::vector<std::vector<std::string>>& refs,
                      const BleuOptions& o = {});

}  // namespace fp8lab::results
