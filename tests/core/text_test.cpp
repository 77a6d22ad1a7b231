// Text helpers: the TOML pre-check refuses non-ASCII outside strings and comments (where
// Debian's toml++ has undefined behaviour on some characters) and lets everything else
// through; number formatting.
#include <gtest/gtest.h>

#include "../common/testutil.hpp"
#include "fp8lab/core/text.hpp"

using namespace fp8lab;
using test::error_of;

TEST(Text, TomlCheckRefusesNonAsciiOutsideStringsAndComments) {
  for (const char* ok : {"name = \"r\xc3\xa9sum\xc3\xa9\"\n", "# caf\xc3\xa9\nx = 1\n", "x = '''\n\xc3\xa9\n'''\n",
                         "x = \"\"\"a\n\xe2\x80\x83\"\"\"\n", "a.\"\xc3\xa9\" = 1\n", "x = [\"\xc3\xa9\", '\xc3\xa9']\n",
                         "x = { y = \"\xc3\xa9\" }\n", "x = \"a\\\"\xc3\xa9\"\n"})
    EXPECT_EQ(error_of([&] { check_toml_text(ok, "t.toml"); }), "") << ok;
  for (const auto& [bad, line] : std::vector<std::pair<std::string, int>>{
           {"\xc3\xa9 = 1\n", 1},
           {"x = 1\ny = 2 \xef\xb7\xbf\n", 2},
           {"name =2-2e\"\"\"e\xce\x97\n", 1},  // a quote inside a number opens no string
           {"x = \"a\"\n\xe3\x80\x81\n", 2}}) {
    const std::string e = error_of([&] { check_toml_text(bad, "t.toml"); });
    EXPECT_NE(e.find("t.toml:" + std::to_string(line) + ": a non-ASCII character outside a string"),
              std::string::npos)
        << bad << " -> " << e;
  }
}

TEST(Text, NumbersAndTrim) {
  EXPECT_EQ(shortest_float(0.1), "0.1");
  EXPECT_EQ(shortest_float(2.0), "2.0");
  EXPECT_EQ(shortest_float(1e-5), "1e-05");
  EXPECT_EQ(shortest_float(-1.0 / 0.0), "-inf");
  EXPECT_EQ(fixed(2.0 / 3.0, 3), "0.667");
  EXPECT_EQ(trim("  a b \t\n"), "a b");
}
