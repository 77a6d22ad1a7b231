#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "../common/testutil.hpp"
#include "fp8lab/core/error.hpp"
#include "fp8lab/core/npy.hpp"

using namespace fp8lab;
namespace fs = std::filesystem;

namespace {
fs::path tmpdir() { return test::temp_dir("fp8lab_npy"); }
std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void spit(const fs::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary);
  out << s;
}
// The bytes of a valid float32 .npy of shape (4,), written with write_npy into `d`.
std::string good_npy(const fs::path& d) {
  NpyArray a;
  a.shape = {4};
  a.data.resize(16);
  write_npy((d / "good.npy").string(), a);
  return slurp(d / "good.npy");
}
std::string error_of(const fs::path& p) {
  try {
    read_npy(p.string());
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(Npy, RoundTripsEveryDtypeAndShape) {
  const fs::path d = tmpdir();
  for (DType t : {DType::f32, DType::u8, DType::u16}) {
    for (auto shape : {std::vector<std::size_t>{5}, std::vector<std::size_t>{2, 3, 4},
                       std::vector<std::size_t>{0}, std::vector<std::size_t>{}}) {
      NpyArray a;
      a.dtype = t;
      a.shape = shape;
      a.data.resize(a.size() * itemsize(t));
      for (std::size_t i = 0; i < a.data.size(); ++i) a.data[i] = static_cast<std::uint8_t>(i * 7);
      const fs::path p = d / "a.npy";
      write_npy(p.string(), a);
      const std::string bytes = slurp(p);
      EXPECT_EQ((bytes.size() - a.data.size()) % 64, 0u);  // data aligned as NumPy writes it
      const NpyArray b = read_npy(p.string());
      EXPECT_EQ(b.dtype, a.dtype);
      EXPECT_EQ(b.shape, a.shape);
      EXPECT_EQ(b.data, a.data);
    }
  }
  fs::remove_all(d);
}

TEST(Npy, ReadsWhatNumpyWrites) {
  // np.save of np.array([[1.5, -2.0]], dtype=np.float32), byte for byte.
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2), }";
  header.append(128 - 10 - header.size() - 1, ' ');
  header += '\n';
  std::string file = std::string("\x93NUMPY\x01\x00", 8);
  file += static_cast<char>(header.size());
  file += '\0';
  file += header;
  const float v[2] = {1.5f, -2.0f};
  file.append(reinterpret_cast<const char*>(v), 8);
  const fs::path p = tmpdir() / "np.npy";
  spit(p, file);
  const NpyArray a = read_npy(p.string());
  ASSERT_EQ(a.shape, (std::vector<std::size_t>{1, 2}));
  float w[2];
  std::memcpy(w, a.data.data(), 8);
  EXPECT_EQ(w[0], 1.5f);
  EXPECT_EQ(w[1], -2.0f);
}

TEST(Npy, BadFilesGiveErrorsWithPlace) {
  const fs::path d = tmpdir();
  const std::string good = good_npy(d);

  spit(d / "trunc.npy", good.substr(0, good.size() - 3));
  std::string e = error_of(d / "trunc.npy");
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
  EXPECT_NE(e.find("offset " + std::to_string(good.size() - 16)), std::string::npos) << e;
  EXPECT_NE(e.find("trunc.npy"), std::string::npos) << e;

  spit(d / "magic.npy", "PK\x03\x04 not numpy at all");
  EXPECT_NE(error_of(d / "magic.npy").find("bad magic"), std::string::npos);

  spit(d / "short.npy", good.substr(0, 30));
  EXPECT_NE(error_of(d / "short.npy").find("runs past the end"), std::string::npos);

  std::string f64 = good;
  f64.replace(f64.find("<f4"), 3, "<f8");
  spit(d / "f64.npy", f64);
  EXPECT_NE(error_of(d / "f64.npy").find("dtype '<f8' is not supported"), std::string::npos);

  spit(d / "extra.npy", good + "xx");
  EXPECT_NE(error_of(d / "extra.npy").find("unexpected bytes"), std::string::npos);

  EXPECT_NE(error_of(d / "missing.npy").find("cannot open"), std::string::npos);
  fs::remove_all(d);
}

TEST(Npy, ShapesAreCheckedAgainstTheBytesPresentBeforeTheyAreMultiplied) {
  const fs::path d = tmpdir();
  const std::string good = good_npy(d);
  // Shapes whose product overflows 64 bits, or is merely larger than the file, are errors
  // naming the problem; nothing is allocated for them.
  for (const auto& [shape, expected] : std::vector<std::pair<std::string, std::string>>{
           {"(4294967296, 4294967296)", "shape (4294967296, 4294967296) has more elements than fit in 64 bits"},
           {"(1099511627776, 1099511627776, 1099511627776)", "has more elements than fit in 64 bits"},
           {"(2147483648, 2147483648)", "needs more bytes than fit in 64 bits"},
           {"(1099511627776,)", "data holds 16 bytes but the shape needs 4398046511104 (file truncated?)"},
           {"(2, 3)", "data holds 16 bytes but the shape needs 24"}}) {
    std::string h = good;
    h.replace(h.find("(4,)"), 4, shape);
    // Keep the header length: the data still starts where it did (pad or trim the spaces).
    const std::size_t nl = h.find('\n');
    const long delta = static_cast<long>(shape.size()) - 4;
    if (delta > 0) h.erase(nl - static_cast<std::size_t>(delta), static_cast<std::size_t>(delta));
    else h.insert(nl, static_cast<std::size_t>(-delta), ' ');
    spit(d / "shape.npy", h);
    const std::string e = error_of(d / "shape.npy");
    EXPECT_NE(e.find(expected), std::string::npos) << shape << ": " << e;
  }
  // A zero dimension is an empty array, whatever the others.
  std::string h = good;
  h.replace(h.find("(4,)"), 4, "(0,9)");
  h.erase(h.find('\n') - 1, 1);
  spit(d / "zero.npy", h.substr(0, good.size() - 16));
  EXPECT_EQ(read_npy((d / "zero.npy").string()).size(), 0u);
  // Folders and devices are not files.
  EXPECT_NE(error_of(d).find("is a folder"), std::string::npos);
  EXPECT_NE(error_of("/dev/null").find("is not a regular file"), std::string::npos);
  fs::remove_all(d);
}

TEST(Npy, FailedWriteLeavesNothingBehind) {
  const fs::path d = tmpdir();
  NpyArray a;
  a.shape = {1};
  a.data.resize(4);
  EXPECT_THROW(write_npy((d / "no_such_dir" / "x.npy").string(), a), Error);
  // An existing file is replaced whole or not at all.
  write_npy((d / "x.npy").string(), a);
  const std::string before = slurp(d / "x.npy");
  NpyArray bad = a;
  bad.data.resize(3);  // inconsistent: refused before anything is written
  EXPECT_THROW(write_npy((d / "x.npy").string(), bad), Error);
  EXPECT_EQ(slurp(d / "x.npy"), before);
  int files = 0;
  for (auto& e : fs::directory_iterator(d)) files += e.is_regular_file();
  EXPECT_EQ(files, 1);  // no temporaries left
  fs::remove_all(d);
}
