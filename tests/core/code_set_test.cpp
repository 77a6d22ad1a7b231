// A scaled format's code set on disk: written whole, read back as written, and refused when
// its parts do not belong together (a part from another set, a lost or edited manifest
// entry, another format or axis).
#include <gtest/gtest.h>

#include <filesystem>

#include "../common/testutil.hpp"
#include "fp8lab/core/code_set.hpp"
#include "fp8lab/core/files.hpp"

using namespace fp8lab;
namespace fs = std::filesystem;
using test::error_of;

namespace {
fs::path fresh(const std::string& name) {
  const fs::path d = test::temp_dir("fp8lab_code_set") / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

CodeSet a_set(std::uint8_t fill, bool tensor_scale) {
  CodeSet s;
  s.codes = NpyArray{DType::u8, {2, 32}, false, std::vector<std::uint8_t>(64, fill)};
  s.scales = NpyArray{DType::u8, {2, 1}, false, {127, static_cast<std::uint8_t>(120 + fill)}};
  if (tensor_scale) s.tensor_scale = NpyArray{DType::f32, {1}, false, {0, 0, static_cast<std::uint8_t>(128 + fill), 63}};
  return s;
}

const char* kMx = "e2m1fn@1x32:e8m0:floor";
const char* kNv = "e2m1fn@1x16:ue4m3:nearest+fp32";
}  // namespace

TEST(CodeSet, RoundTripsWithAndWithoutATensorScale) {
  const fs::path d = fresh("round");
  const std::string p = (d / "c.npy").string();
  write_code_set(p, kMx, 1, a_set(3, false));
  EXPECT_TRUE(fs::exists(d / "c.scales.npy"));
  EXPECT_TRUE(fs::exists(d / "c.codeset"));
  EXPECT_FALSE(fs::exists(d / "c.tensor_scale.npy"));
  const CodeSet r = read_code_set(p, kMx, 1, false);
  EXPECT_EQ(r.codes.data, a_set(3, false).codes.data);
  EXPECT_EQ(r.scales.data, a_set(3, false).scales.data);
  EXPECT_FALSE(r.tensor_scale);
  const std::string q = (d / "n.npy").string();
  write_code_set(q, kNv, 1, a_set(5, true));
  const CodeSet n = read_code_set(q, kNv, 1, true);
  ASSERT_TRUE(n.tensor_scale);
  EXPECT_EQ(n.tensor_scale->data, a_set(5, true).tensor_scale->data);
  EXPECT_EQ(code_set_paths(q, true).size(), 4u);
}

TEST(CodeSet, RefusesPartsThatDoNotBelongTogether) {
  const fs::path d = fresh("mixed");
  const std::string a = (d / "a.npy").string(), b = (d / "b.npy").string();
  write_code_set(a, kNv, 1, a_set(1, true));
  write_code_set(b, kNv, 1, a_set(2, true));
  // Another format, another axis.
  std::string e = error_of([&] { read_code_set(a, kMx, 1, false); });
  EXPECT_NE(e.find("written for " + std::string(kNv)), std::string::npos) << e;
  e = error_of([&] { read_code_set(a, kNv, 0, true); });
  EXPECT_NE(e.find("axis 1, not 0"), std::string::npos) << e;
  // Each part taken from the other set, in turn.
  for (const char* part : {".scales.npy", ".tensor_scale.npy", ".npy"}) {
    SCOPED_TRACE(part);
    const fs::path mine = d / (std::string("a") + part), theirs = d / (std::string("b") + part);
    const std::string keep = read_file(mine.string());
    fs::copy_file(theirs, mine, fs::copy_options::overwrite_existing);
    e = error_of([&] { read_code_set(a, kNv, 1, true); });
    EXPECT_NE(e.find("does not belong to the code set"), std::string::npos) << e;
    EXPECT_NE(e.find(mine.string()), std::string::npos) << e;
    write_file_atomic(mine.string(), keep);
    read_code_set(a, kNv, 1, true);
  }
  // A damaged manifest is refused, never taken as "no manifest".
  const std::string manifest = read_file((d / "a.codeset").string());
  for (const std::string& bad : {std::string(), std::string("garbage\n"), manifest.substr(0, manifest.size() / 2),
                                 manifest + "codes a.npy bytes=1 fnv1a64=0000000000000000\n",
                                 manifest + "extra line\n"}) {
    write_file_atomic((d / "a.codeset").string(), bad);
    e = error_of([&] { read_code_set(a, kNv, 1, true); });
    EXPECT_NE(e.find("a.codeset"), std::string::npos) << e;
  }
  // Without a manifest (a set written by another program) the parts are read as they are.
  fs::remove(d / "a.codeset");
  EXPECT_EQ(read_code_set(a, kNv, 1, true).codes.data, a_set(1, true).codes.data);
}

TEST(CodeSet, AFailedWriteKeepsTheWholeOldSet) {
  const fs::path d = fresh("failed");
  const std::string p = (d / "c.npy").string();
  write_code_set(p, kMx, 1, a_set(1, false));
  // The new codes cannot be written (a folder stands where a temporary's target would be
  // replaced): nothing of the new set lands.
  const std::string old_scales = read_file((d / "c.scales.npy").string());
  fs::remove(d / "c.npy");
  fs::create_directories(d / "c.npy");
  EXPECT_NE(error_of([&] { write_code_set(p, kMx, 1, a_set(2, false)); }).find("is a folder"), std::string::npos);
  EXPECT_EQ(read_file((d / "c.scales.npy").string()), old_scales);
}
