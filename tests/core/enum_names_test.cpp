// The enum name tables (enum_names.hpp): each name prints and parses back to its value, an
// unknown name is an error listing the known ones in the table's order, and a value the
// table leaves out prints as "?".
#include <gtest/gtest.h>

#include "../common/testutil.hpp"
#include "fp8lab/core/enum_names.hpp"

using namespace fp8lab;
using test::error_of;

namespace {

enum class Colour { red, green, blue, unlisted };

constexpr EnumName<Colour> kColours[] = {{Colour::red, "red"}, {Colour::green, "green"}, {Colour::blue, "blue"}};

}  // namespace

TEST(EnumNames, EveryNameParsesBackToItsValue) {
  for (Colour c : {Colour::red, Colour::green, Colour::blue})
    EXPECT_EQ(enum_parse(kColours, enum_name(kColours, c), "colour"), c);
  EXPECT_EQ(enum_name(kColours, Colour::green), "green");
  static_assert(enum_name(kColours, Colour::blue) == "blue");  // usable at compile time
}

TEST(EnumNames, UnknownNamesListTheKnownOnesInOrder) {
  EXPECT_EQ(enum_names(kColours), "red, green, blue");
  EXPECT_EQ(error_of([] { (void)enum_parse(kColours, "Red", "colour"); }),
            "unknown colour 'Red' (known: red, green, blue)");
  EXPECT_EQ(error_of([] { (void)enum_parse(kColours, "", "colour"); }), "unknown colour '' (known: red, green, blue)");
}

TEST(EnumNames, UnlistedValuePrintsAsQuestionMark) { EXPECT_EQ(enum_name(kColours, Colour::unlisted), "?"); }
