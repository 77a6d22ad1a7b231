// The Bible corpus preparation on small fixtures (markup stripping, Strong's numbers,
// alignment with a shifted chapter and empty verses, the split) and, where Debian's SWORD
// modules are installed, on the real modules.
#include <gtest/gtest.h>
#include <sys/stat.h>


#include <filesystem>
#include <fstream>
#include <map>

#include "../common/testutil.hpp"
#include "fp8lab/data/bitext.hpp"

using namespace fp8lab;
namespace fs = std::filesystem;
using test::error_of;

TEST(Osis, StripsMarkupKeepsWords) {
  EXPECT_EQ(data::strip_osis(R"(In the <w lemma="strong:H7225">beginning</w> <w lemma="strong:H0430">God</w>.)"),
            "In the beginning God.");
  // Notes become a space (not glued to the next word); added words are kept.
  EXPECT_EQ(data::strip_osis(R"(the <w>light</w>.<note placement="foot"><reference>1.4 </reference>Heb. between</note>And <transChange type="added">it was</transChange> good)"),
            "the light. And it was good");
  // Canonical titles (psalm superscriptions) stay; section titles go.
  EXPECT_EQ(data::strip_osis(R"(<title canonical="true" type="psalm">A <w>Psalm</w> of David.</title> <lg sID="a"/><l level="1"/><divineName><w>LORD</w></divineName>, how)"),
            "A Psalm of David. LORD, how");
  EXPECT_EQ(data::strip_osis(R"(<title>ALEPH.</title><w>Blessed</w> are)"), "Blessed are");
  EXPECT_EQ(data::strip_osis("<div sID=\"x\" type=\"x-p\"/>\xc2\xb6 Now the <w>LORD</w>&amp;co"), "Now the LORD&co");
  EXPECT_EQ(data::strip_osis(R"(<chapter eID="Jonah.1"/><div eID="gen923" type="x-p"/>)"), "");
  EXPECT_EQ(data::strip_osis("word<lb/>word"), "word word");  // block tags separate words
  EXPECT_EQ(data::strip_osis("fish<w>’s</w>"), "fish’s");       // inline tags do not
}

TEST(Osis, StrongsNumbers) {
  EXPECT_EQ(data::strongs_numbers(R"(<w lemma="strong:H0430">God</w> <w lemma="strong:H1254 strong:G0025">x</w> <w lemma="strong:H430">y</w>)"),
            (std::vector<std::string>{"G25", "H1254", "H430"}));
  EXPECT_DOUBLE_EQ(data::strongs_agreement({"H1", "H2", "H3", "H4"}, {"H2", "H4"}), 1.0);
  EXPECT_DOUBLE_EQ(data::strongs_agreement({"H1", "H2"}, {"H2", "H5", "H6"}), 0.5);
  EXPECT_DOUBLE_EQ(data::strongs_agreement({}, {"H2"}), -1.0);
}

TEST(Imp, ParsesAndValidates) {
  const auto e = data::parse_imp("$$$[ Module Heading ]\n\n$$$Genesis 0:0\n<div/>\n$$$Genesis 1:0\n<chapter/>\n"
                                 "$$$Genesis 1:1\nIn the beginning\n$$$I Samuel 2:10\na\nb\n",
                                 "kjv.imp");
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[0].ref(), "Genesis 1:1");
  EXPECT_EQ(e[0].raw, "In the beginning");
  EXPECT_EQ(e[1].book, "I Samuel");
  EXPECT_EQ(e[1].raw, "a b");
  std::string m = error_of([] { data::parse_imp("$$$Genesis 1:1\nx\n$$$Genesis one:2\ny\n", "k.imp"); });
  EXPECT_NE(m.find("k.imp:3: bad chapter:verse in 'Genesis one:2'"), std::string::npos) << m;
  m = error_of([] { data::parse_imp("hello\n$$$Genesis 1:1\nx\n", "k.imp"); });
  EXPECT_NE(m.find("k.imp:1: text before the first $$$"), std::string::npos) << m;
  m = error_of([] { data::parse_imp("$$$Genesis\nx\n", "k.imp"); });
  EXPECT_NE(m.find("k.imp:1: bad verse key"), std::string::npos) << m;
}

namespace {
std::string w(int strong, const std::string& word) {
  return "<w lemma=\"strong:H" + std::to_string(strong) + "\">" + word + "</w>";
}
// A verse whose numbers are unique to (chapter, verse).
std::string verse(int c, int v, const std::string& lang) {
  const int base = 1000 * c + 10 * v;
  return w(base, lang + "a") + " " + w(base + 1, lang + "b") + " " + w(base + 2, lang + "c");
}
}  // namespace

TEST(Align, DropsEmptyDisagreeingAndShifted) {
  std::vector<data::ImpEntry> en, es;
  // Chapter 1: 8 verses, aligned except verse 3 (empty in Spanish) and verse 6, whose
  // numbers disagree (an isolated bad pair).
  for (int v = 1; v <= 8; ++v) {
    en.push_back({"Book", 1, v, verse(1, v, "e")});
    es.push_back({"Book", 1, v, v == 3 ? "<chapter/>" : v == 6 ? verse(9, 9, "s") : verse(1, v, "s")});
  }
  // Chapter 2: Spanish verse v holds English verse v-1 from verse 4 on (Hebrew numbering).
  for (int v = 1; v <= 10; ++v) {
    en.push_back({"Book", 2, v, verse(2, v, "e")});
    es.push_back({"Book", 2, v, v < 4 ? verse(2, v, "s") : verse(2, v - 1, "s")});
  }
  en.push_back({"Only", 1, 1, verse(7, 1, "e")});  // in one module only
  data::AlignReport r;
  const auto pairs = data::align_verses(en, es, &r);
  EXPECT_EQ(r.verses, 18u);
  EXPECT_EQ(r.empty, 1u);
  EXPECT_EQ(r.disagreeing, 1u);
  EXPECT_EQ(r.shifted, 7u);  // 2:4 .. 2:10
  ASSERT_EQ(r.shifted_chapters.size(), 1u);
  EXPECT_EQ(r.shifted_chapters[0], "Book 2 (from 4)");
  EXPECT_EQ(r.pairs, 9u);
  ASSERT_EQ(pairs.size(), 9u);
  EXPECT_EQ(pairs[0].ref, "Book 1:1");
  EXPECT_EQ(pairs[0].en, "ea eb ec");
  EXPECT_EQ(pairs[0].es, "sa sb sc");
  EXPECT_EQ(pairs.back().ref, "Book 2:3");
}

TEST(Align, SplitIsDeterministicWithTheAskedProportions) {
  std::map<std::string, int> n;
  for (int i = 0; i < 20000; ++i) ++n[data::split_of("Book " + std::to_string(i / 50) + ":" + std::to_string(i % 50))];
  EXPECT_NEAR(n["dev"] / 20000.0, 0.02, 0.005);
  EXPECT_NEAR(n["test"] / 20000.0, 0.02, 0.005);
  EXPECT_EQ(data::split_of("Genesis 1:1"), data::split_of("Genesis 1:1"));
  EXPECT_EQ(data::split_of("x", 0, 0), "train");
  EXPECT_EQ(data::split_of("x", 100, 0), "dev");
}

TEST(Bitext, ReadValidates) {
  const fs::path d = test::temp_dir("fp8lab_parallel");
  std::ofstream(d / "a.en") << "one\ntwo\n";
  std::ofstream(d / "a.es") << "uno\ndos\n";
  const auto [x, y] = data::read_bitext((d / "a").string(), "en", "es");
  EXPECT_EQ(x, (std::vector<std::string>{"one", "two"}));
  EXPECT_EQ(y[1], "dos");
  std::ofstream(d / "b.en") << "one\ntwo\n";
  std::ofstream(d / "b.es") << "uno\n";
  EXPECT_NE(error_of([&] { data::read_bitext((d / "b").string(), "en", "es"); }).find("has 2 lines but"),
            std::string::npos);
  std::ofstream(d / "c.en") << "one\n\nthree\n";
  std::ofstream(d / "c.es") << "a\nb\nc\n";
  EXPECT_NE(error_of([&] { data::read_bitext((d / "c").string(), "en", "es"); }).find("c.en:2: empty line"),
            std::string::npos);
  std::ofstream(d / "u.en") << "ok\nbad \xff byte\n";
  std::ofstream(d / "u.es") << "a\nb\n";
  EXPECT_NE(error_of([&] { data::read_bitext((d / "u").string(), "en", "es"); }).find("u.en:2: invalid UTF-8 (offset 3)"),
            std::string::npos);
  EXPECT_NE(error_of([&] { data::read_bitext((d / "none").string(), "en", "es"); }).find("cannot open"),
            std::string::npos);
}

TEST(Bitext, LinesEndWithLfOrCrlfAndTheLastNeedsNone) {
  EXPECT_EQ(data::parse_lines("a\r\nb\nc", "t.en"), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(data::parse_lines("a\rb\n", "t.en"), (std::vector<std::string>{"a\rb"}));
  EXPECT_TRUE(data::parse_lines("", "t.en").empty());
  EXPECT_NE(error_of([] { data::parse_lines("a\n\r\n", "t.en"); }).find("t.en:2: empty line (offset 2)"),
            std::string::npos);
  // Overlong forms and surrogates are not UTF-8 either.
  EXPECT_NE(error_of([] { data::parse_lines("a\n\xc0\xaf\n", "t.en"); }).find("t.en:2: invalid UTF-8"),
            std::string::npos);
  EXPECT_NE(error_of([] { data::parse_lines("\xed\xa0\x80\n", "t.en"); }).find("t.en:1: invalid UTF-8"),
            std::string::npos);
}

TEST(BibleCorpus, FromDebianModules) {
  if (std::system("mod2imp engKJV2006eb 2>/dev/null | head -c 3 | grep -q '\\$\\$\\$'") != 0 ||
      std::system("mod2imp spaRV1909eb 2>/dev/null | head -c 3 | grep -q '\\$\\$\\$'") != 0)
    GTEST_SKIP() << "sword-text-kjv, sword-text-sparv or libsword-utils not installed";
  const fs::path d = test::temp_dir("fp8lab_bible");
  fs::remove_all(d);
  const auto f = data::prepare_bible_corpus(d.string());
  const auto& r = f.report;
  EXPECT_EQ(r.verses, 31102u);  // KJV versification
  EXPECT_EQ(r.empty, 18u);      // the Spanish verses whose text sits in a neighbour
  EXPECT_GT(r.pairs, 30600u);
  EXPECT_LT(r.pairs, 31000u);
  auto has = [&](const std::string& c) {
    for (const auto& s : r.shifted_chapters)
      if (s.rfind(c + " (", 0) == 0) return true;
    return false;
  };
  for (const char* c : {"Numbers 13", "Job 39", "Job 40", "Jonah 2", "Hosea 12"}) EXPECT_TRUE(has(c)) << c;
  EXPECT_FALSE(has("Genesis 1"));
  const auto [en, es] = data::read_bitext((d / "train").string(), "en", "es");
  EXPECT_EQ(en.front(), "In the beginning God created the heaven and the earth.");
  EXPECT_EQ(es.front(), "EN el principio crió Dios los cielos y la tierra.");
  std::size_t total = en.size() + data::read_bitext((d / "dev").string(), "en", "es").first.size() +
                      data::read_bitext((d / "test").string(), "en", "es").first.size();
  EXPECT_EQ(total, r.pairs);
  // A second call reuses the prepared files.
  const auto t0 = fs::last_write_time(d / "train.en");
  EXPECT_EQ(data::prepare_bible_corpus(d.string()).report.pairs, r.pairs);
  EXPECT_EQ(fs::last_write_time(d / "train.en"), t0);
  // A report.json that is not what fp8lab writes (edited, damaged) is no reuse: the corpus is
  // built again (it threw nlohmann's type errors, an internal error, before).
  for (const char* damaged : {"{\"version\": \"x\"}", "[1, 2]", "{\"version\": 1, \"verses\": \"many\"}", "7"}) {
    { std::ofstream(d / "report.json") << damaged; }
    EXPECT_EQ(data::prepare_bible_corpus(d.string()).report.pairs, r.pairs) << damaged;
  }
  // One that is no regular file is refused by name, not read (a FIFO would wait forever).
  fs::remove(d / "report.json");
  ASSERT_EQ(::mkfifo((d / "report.json").c_str(), 0600), 0);
  const std::string e = error_of([&] { data::prepare_bible_corpus(d.string()); });
  EXPECT_NE(e.find("report.json: is not a regular file"), std::string::npos) << e;
  fs::remove_all(d);
}
