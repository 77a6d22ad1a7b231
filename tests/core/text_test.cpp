// Text helpers: UTF-8 decoding and encoding (every code point, every 2- and 3-byte
// sequence), the shield that keeps Debian's toml++ away from the characters it mishandles
// and parse_toml behind it (every character in every kind of place), number formatting, CSV fields.
#include <gtest/gtest.h>

#include "../common/testutil.hpp"
#include "fp8lab/core/format.hpp"
#include "fp8lab/core/text.hpp"
#include "fp8lab/core/toml_parse.hpp"

using namespace fp8lab;
using test::error_of;

namespace {

bool surrogate(char32_t cp) { return cp >= 0xD800 && cp <= 0xDFFF; }

// The UTF-8 of a code point as the standard's Table 3-6 lays out the bits, written out
// here independently of utf8_encode.
std::string reference_utf8(char32_t cp) {
  std::string s;
  const auto put = [&](unsigned v) { s += static_cast<char>(v); };
  if (cp < 0x80) {
    put(cp);
  } else if (cp < 0x800) {
    put(0xC0 + cp / 64), put(0x80 + cp % 64);
  } else if (cp < 0x10000) {
    put(0xE0 + cp / 4096), put(0x80 + cp / 64 % 64), put(0x80 + cp % 64);
  } else {
    put(0xF0 + cp / 262144), put(0x80 + cp / 4096 % 64), put(0x80 + cp / 64 % 64), put(0x80 + cp % 64);
  }
  return s;
}

}  // namespace

TEST(Text, Utf8EveryCodePointEncodesAndDecodes) {
  for (char32_t cp = 0; cp <= 0x10FFFF; ++cp) {
    if (surrogate(cp)) continue;
    const std::string e = utf8_encode(cp);
    ASSERT_EQ(e, reference_utf8(cp)) << std::hex << static_cast<unsigned>(cp);
    const auto ch = utf8_at(e, 0);
    ASSERT_TRUE(ch && ch->code_point == cp && ch->size == e.size()) << std::hex << static_cast<unsigned>(cp);
  }
}

TEST(Text, Utf8AcceptsExactlyTheEncodingsOfCodePoints) {
  // Every 2- and 3-byte sequence with a non-ASCII first byte: accepted as one character
  // exactly when it is the encoding of a code point (so no overlong forms, no surrogates).
  std::size_t two = 0, three = 0;
  for (unsigned a = 0x80; a < 0x100; ++a)
    for (unsigned b = 0; b < 0x100; ++b) {
      const std::string s{static_cast<char>(a), static_cast<char>(b)};
      const auto ch = utf8_at(s, 0);
      if (ch && ch->size == 2) {
        ++two;
        ASSERT_EQ(reference_utf8(ch->code_point), s);
      }
      for (unsigned c = 0; c < 0x100; ++c) {
        const std::string t = s + static_cast<char>(c);
        const auto ct = utf8_at(t, 0);
        if (ct && ct->size == 3) {
          ++three;
          ASSERT_EQ(reference_utf8(ct->code_point), t);
        }
      }
    }
  EXPECT_EQ(two, 0x800u - 0x80u);
  EXPECT_EQ(three, 0x10000u - 0x800u - 0x800u);  // less the surrogates
  for (const char* bad : {"\x80", "\xC0\x80", "\xC1\xBF", "\xE0\x80\x80", "\xED\xA0\x80", "\xF0\x80\x80\x80",
                          "\xF4\x90\x80\x80", "\xF5\x80\x80\x80", "\xFF", "\xE2\x82", "\xF0\x9F\x98"})
    EXPECT_FALSE(utf8_at(bad, 0)) << bad;
  EXPECT_TRUE(valid_utf8("caf\xC3\xA9 \xF0\x9F\x98\x80"));
  EXPECT_FALSE(valid_utf8("caf\xC3"));
}

TEST(Text, TomlShieldMovesTheBmpOutOfReachAndBackForEveryCodePoint) {
  for (char32_t cp = 0; cp <= 0x10FFFF; ++cp) {
    if (surrogate(cp) || (cp >= 0xF0000 && cp <= 0xFFFFF)) continue;
    const std::string s = "x = \"" + utf8_encode(cp) + "\"\n";
    const std::string shielded = shield_toml_text(s, "t.toml");
    for (std::size_t i = 0; i < shielded.size();) {
      const auto ch = utf8_at(shielded, i);
      ASSERT_TRUE(ch) << std::hex << static_cast<unsigned>(cp);
      ASSERT_TRUE(ch->code_point < 0x80 || ch->code_point >= 0x10000) << std::hex << static_cast<unsigned>(cp);
      i += ch->size;
    }
    ASSERT_EQ(unshield_toml_text(shielded), s) << std::hex << static_cast<unsigned>(cp);
  }
}

TEST(Text, TomlShieldRefusesWhatItCannotInvert) {
  for (const auto& [bad, what] : std::vector<std::pair<std::string, std::string>>{
           {"x = 1\ny = \"\xC3\"\n", "t.toml:2: not UTF-8 (byte 0xC3 at offset 11)"},
           {"x = 1\n\n# \xC0\x80\n", "t.toml:3: not UTF-8 (byte 0xC0 at offset 9)"},
           {"x = \"\xF3\xB0\x80\x80\"\n", "t.toml:1: a plane-15 private-use character"},
           {"\nx = \"\\U000F0041\"\n", "t.toml:2: an escape of a plane-15 private-use character"},
           {"x = \"\\U000f0041\"\n", "t.toml:1: an escape of a plane-15 private-use character"},
           {"x = \"\\\\\\U000F0041\"\n", "t.toml:1: an escape of a plane-15 private-use character"}}) {
    const std::string e = error_of([&] { (void)shield_toml_text(bad, "t.toml"); });
    EXPECT_EQ(e.rfind(what, 0), 0u) << bad << " -> " << e;
  }
}

// An escaped backslash before U000F is text, not an escape: what to_toml writes for a
// string holding a backslash reads back (a fuzz input found this refused).
TEST(Text, TomlShieldKeepsEscapedBackslashBeforeU000F) {
  for (const std::string text : {"x = \"\\\\U000F0041\"\n", "x = \"a\\\\\\\\U000f\"\n", "x = \"\\U0010FFFF\"\n"})
    EXPECT_EQ(unshield_toml_text(shield_toml_text(text, "t.toml")), text);
  const auto table = parse_toml("x = \"\\\\U000F0041\"\n", "t.toml");
  EXPECT_EQ(table["x"].value<std::string>(), std::optional<std::string>("\\U000F0041"));
}

// Every non-ASCII character of the Basic Multilingual Plane (where Debian's toml++ has
// undefined behaviour on many) in every kind of place: kept exactly in strings, keys and
// comments, an Error everywhere else.
TEST(Text, TomlParseTakesEveryCharacterAnywhere) {
  for (char32_t cp = 0x80; cp < 0x10000; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    const std::string c = utf8_encode(cp);
    for (const std::string& doc : {"k = \"" + c + "\"\n", "k = '" + c + "'\n", "k = \"\"\"\n" + c + "\"\"\"\n"}) {
      const toml::table t = parse_toml(doc, "t.toml");
      ASSERT_EQ(t["k"].value<std::string>(), c) << std::hex << static_cast<unsigned>(cp);
    }
    const toml::table keyed = parse_toml("\"" + c + "\" = 1\n[t.'" + c + "']\nk = 2 # " + c + "\n", "t.toml");
    ASSERT_EQ(keyed[c].value<int>(), 1) << std::hex << static_cast<unsigned>(cp);
    ASSERT_EQ(keyed["t"][c]["k"].value<int>(), 2) << std::hex << static_cast<unsigned>(cp);
    for (const std::string& doc : {"k = 1" + c + "\n", c + " = 1\n", "k = " + c + "\n", "k = 1..\"" + c + "\"\n",
                                   "k =" + c + " 1\n", "[a" + c + "]\n", "k = [1," + c + "]\n", "k = tru" + c + "\n"}) {
      bool refused = false;
      try {
        (void)parse_toml(doc, "t.toml");
      } catch (const Error& e) {
        refused = std::string(e.what()).rfind("t.toml:1: ", 0) == 0;
      }
      ASSERT_TRUE(refused) << std::hex << static_cast<unsigned>(cp) << ": " << doc;
    }
  }
}

TEST(Text, NumbersAndTrim) {
  EXPECT_EQ(shortest_float(0.1), "0.1");
  EXPECT_EQ(shortest_float(2.0), "2.0");
  EXPECT_EQ(shortest_float(1e-5), "1e-05");
  EXPECT_EQ(shortest_float(-1.0 / 0.0), "-inf");
  EXPECT_EQ(fixed(2.0 / 3.0, 3), "0.667");
  EXPECT_EQ(trim("  a b \t\n"), "a b");
  EXPECT_EQ(parse_number("1e-3"), 1e-3);
  EXPECT_EQ(parse_number("-2.5"), -2.5);
  EXPECT_EQ(parse_number("0x1p-3"), 0.125);
  for (const char* bad : {"", " 1", "1 ", "1x", "inf", "-inf", "nan", "1e999", "--1"})
    EXPECT_FALSE(parse_number(bad).has_value()) << bad;
}

TEST(Text, CsvFieldQuotesOnlyWhatNeedsIt) {
  EXPECT_EQ(csv_field(""), "");
  EXPECT_EQ(csv_field("1.4.3 b10"), "1.4.3 b10");
  EXPECT_EQ(csv_field("a=1.4.3:10,w=fp32"), "\"a=1.4.3:10,w=fp32\"");
  EXPECT_EQ(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
  EXPECT_EQ(csv_field("two\nlines"), "\"two\nlines\"");
  EXPECT_EQ(csv_field("cr\r"), "\"cr\r\"");
}

TEST(Text, PrintableShowsControlCharactersOnOneLine) {
  EXPECT_EQ(printable(std::string("a\nb\tc\rd\0e\x1b[1m\x7f", 14)), "a\\nb\\tc\\rd\\0e\\x1b[1m\\x7f");
  EXPECT_EQ(printable("plain text, \xc3\xa9t\xc3\xa9"), "plain text, \xc3\xa9t\xc3\xa9");  // UTF-8 stays
}

// An error message that quotes input with a NUL or an escape sequence keeps all of it, on
// the terminal as text: what() is a C string, which a raw NUL would cut short.
TEST(Text, ErrorMessagesKeepWhatFollowsANul) {
  const Error e("name 'a" + std::string(1, '\0') + "b\x1b[2J' is bad\nsecond line");
  EXPECT_EQ(std::string(e.what()), "name 'a\\0b\\x1b[2J' is bad\nsecond line");
}
