// The shared file helpers: atomic writes replace a file whole or not at all, reads name the
// file on error, and the content hash matches FNV-1a's published test vectors.
#include <gtest/gtest.h>

#include <filesystem>

#include "../common/testutil.hpp"
#include "fp8lab/core/files.hpp"

using namespace fp8lab;
namespace fs = std::filesystem;
using test::error_of;

TEST(Files, AtomicWriteReplacesTheFileAndLeavesNoTemporary) {
  const fs::path d = test::temp_dir("fp8lab_files") / "atomic";
  fs::remove_all(d);
  fs::create_directories(d);
  const std::string p = (d / "out.txt").string();
  write_file_atomic(p, std::string("first"));
  EXPECT_EQ(read_file(p), "first");
  write_file_atomic(p, std::string("second, longer"));
  EXPECT_EQ(read_file(p), "second, longer");
  write_file_atomic(p, std::string());
  EXPECT_EQ(read_file(p), "");
  std::size_t files = 0;
  for (const auto& e : fs::directory_iterator(d)) files += e.is_regular_file();
  EXPECT_EQ(files, 1u);
  // A write that cannot happen throws naming the path and leaves nothing behind.
  const std::string bad = (d / "no-such-folder" / "x.txt").string();
  EXPECT_NE(error_of([&] { write_file_atomic(bad, std::string("x")); }).find(bad), std::string::npos);
  EXPECT_FALSE(fs::exists(d / "no-such-folder"));
}

TEST(Files, ReadErrorsNameTheFile) {
  const fs::path d = test::temp_dir("fp8lab_files");
  const std::string missing = (d / "missing.txt").string();
  EXPECT_NE(error_of([&] { read_file(missing); }).find(missing + ": cannot open"), std::string::npos);
  EXPECT_NE(error_of([&] { read_file(d.string()); }).find("is a folder"), std::string::npos);
}

TEST(Files, Fnv1aMatchesPublishedVectors) {
  EXPECT_EQ(fnv1a(kFnvBasis, "", 0), 0xcbf29ce484222325ULL);
  EXPECT_EQ(fnv1a(kFnvBasis, "a", 1), 0xaf63dc4c8601ec8cULL);
  EXPECT_EQ(fnv1a(kFnvBasis, "foobar", 6), 0x85944171f73967e8ULL);
  // Continuing from a prefix's hash is hashing the whole.
  EXPECT_EQ(fnv1a(fnv1a(kFnvBasis, "foo", 3), "bar", 3), 0x85944171f73967e8ULL);
}
