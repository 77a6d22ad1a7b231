// The shared file helpers: atomic writes replace a file whole or not at all, reads name the
// file on error, and the content hash matches FNV-1a's published test vectors.
#include <gtest/gtest.h>

#include <cctype>
#include <cstdio>

#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

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

TEST(Files, ChecksumFrameRoundTripsAndRefusesEveryChange) {
  static constexpr char kBytes[] = "PK\x03\x04 payload\nwith \0 bytes";
  const std::string magic = "fp8lab-checkpoint ", payload(kBytes, sizeof kBytes - 1);  // 25 bytes, a NUL among them
  ASSERT_EQ(payload.size(), 25u);
  const std::string framed = checksum_frame(magic, payload);
  // The header written by hand from the published FNV-1a definition (fnv1a is tested above).
  char sum[17];
  std::snprintf(sum, sizeof sum, "%016llx", static_cast<unsigned long long>(fnv1a(kFnvBasis, payload.data(), payload.size())));
  EXPECT_EQ(framed, magic + "bytes=25 fnv1a64=" + sum + "\n" + payload);
  std::string b = framed;
  EXPECT_TRUE(checksum_unframe(b, magic, "c.ckpt", "checkpoint"));
  EXPECT_EQ(b, payload);
  std::string legacy = "PK\x03\x04 an older file";
  EXPECT_FALSE(checksum_unframe(legacy, magic, "c.ckpt", "checkpoint"));
  EXPECT_EQ(legacy, "PK\x03\x04 an older file");
  const std::string header = magic + "bytes=25 fnv1a64=" + sum;
  std::string upper = sum;
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (const auto& [bad, what] : std::vector<std::pair<std::string, std::string>>{
           {header + "\n" + payload.substr(1), "24 bytes after the header, 25 written"},
           {header + "\n" + payload + "x", "26 bytes after the header, 25 written"},
           {magic + "bytes=25 fnv1a64=" + std::string(16, '0') + "\n" + payload, "checksum " + std::string(sum)},
           {magic + "bytes=025 fnv1a64=" + sum + "\n" + payload, "unreadable header line"},
           {magic + "bytes=+25 fnv1a64=" + sum + "\n" + payload, "unreadable header line"},
           {magic + "bytes=25 fnv1a64=" + upper + "\n" + payload, "unreadable header line"},
           {magic + "bytes=25  fnv1a64=" + sum + "\n" + payload, "unreadable header line"},
           {magic + "bytes=99999999999999999999 fnv1a64=" + sum + "\n" + payload, "unreadable header line"},
           {header, "unreadable header line"}}) {
    std::string x = bad;
    const std::string e = error_of([&] { (void)checksum_unframe(x, magic, "c.ckpt", "checkpoint"); });
    EXPECT_EQ(e.rfind("c.ckpt: damaged checkpoint: ", 0), 0u) << e;
    EXPECT_NE(e.find(what), std::string::npos) << e;
  }
}

TEST(Files, WritesFollowLinksAndNeverReplaceDevicesOrPipes) {
  const fs::path d = test::temp_dir("fp8lab_files") / "special";
  fs::remove_all(d);
  fs::create_directories(d);
  // A symbolic link: the target gets the bytes, the link stays a link.
  const fs::path target = d / "target.txt", link = d / "link.txt";
  write_file_atomic(target.string(), std::string("old"));
  fs::create_symlink(target, link);
  write_file_atomic(link.string(), std::string("new"));
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_EQ(read_file(target.string()), "new");
  // A device is written in place, not replaced by a regular file.
  write_file_atomic("/dev/null", std::string("discarded"));
  EXPECT_TRUE(fs::is_character_file("/dev/null"));
  // A FIFO is written in place: a reader on the other end gets the bytes.
  const fs::path fifo = d / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::string got;
  std::thread reader([&] {
    std::ifstream in(fifo);
    got.assign(std::istreambuf_iterator<char>(in), {});
  });
  write_file_atomic(fifo.string(), std::string("through the pipe"));
  reader.join();
  EXPECT_EQ(got, "through the pipe");
  EXPECT_TRUE(fs::is_fifo(fifo));
  // A folder is an error.
  EXPECT_NE(test::error_of([&] { write_file_atomic(d.string(), std::string("x")); }).find("is a folder"),
            std::string::npos);
}

TEST(Files, ASetOfSeveralFilesRefusesADeviceOrPipeBeforeWritingAny) {
  // A device or pipe is written at once, in place: it cannot wait for the set's renames.
  const fs::path d = test::temp_dir("fp8lab_files") / "set_device";
  fs::remove_all(d);
  fs::create_directories(d);
  const fs::path fifo = d / "codes.npy", side = d / "codes.scales.npy";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string err = test::error_of([&] {
    write_files_atomic({{side.string(), "scales"}, {fifo.string(), "codes"}});
  });
  EXPECT_NE(err.find("codes.npy: is not a regular file"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(side));
  EXPECT_TRUE(fs::is_fifo(fifo));
  EXPECT_EQ(std::distance(fs::directory_iterator(d), fs::directory_iterator()), 1);  // no temporaries
  // A set of one is a plain write: a device takes it in place.
  write_files_atomic({{"/dev/null", "discarded"}});
  EXPECT_TRUE(fs::is_character_file("/dev/null"));
}

TEST(Files, MakeFolderNamesAFileInTheWay) {
  const fs::path d = test::temp_dir("fp8lab_files") / "folders";
  fs::remove_all(d);
  make_folder((d / "a" / "b").string());
  EXPECT_TRUE(fs::is_directory(d / "a" / "b"));
  make_folder((d / "a" / "b").string());  // there already: nothing to do
  write_file_atomic((d / "f").string(), std::string("x"));
  const std::string e = test::error_of([&] { make_folder((d / "f" / "out").string()); });
  EXPECT_NE(e.find("f: exists and is not a folder (a folder is needed for "), std::string::npos) << e;
  EXPECT_EQ(read_file((d / "f").string()), "x");
}

TEST(Files, SameFileIsDecidedByIdentityNotName) {
  const fs::path d = test::temp_dir("fp8lab_files") / "same";
  fs::remove_all(d);
  fs::create_directories(d);
  const fs::path a = d / "a.npy";
  write_file_atomic(a.string(), std::string("x"));
  fs::create_hard_link(a, d / "hard.npy");
  fs::create_symlink(a, d / "soft.npy");
  EXPECT_TRUE(same_file(a.string(), (d / "hard.npy").string()));
  EXPECT_TRUE(same_file(a.string(), (d / "soft.npy").string()));
  EXPECT_TRUE(same_file(a.string(), (d / "." / "a.npy").string()));
  write_file_atomic((d / "b.npy").string(), std::string("x"));
  EXPECT_FALSE(same_file(a.string(), (d / "b.npy").string()));
  EXPECT_FALSE(same_file(a.string(), (d / "missing.npy").string()));
}

namespace {
// The files of folder `d`, sorted.
std::vector<std::string> names_in(const fs::path& d) {
  std::vector<std::string> n;
  for (const auto& e : fs::directory_iterator(d)) n.push_back(e.path().filename().string());
  std::sort(n.begin(), n.end());
  return n;
}

// Runs `f` in a child process under a file-size limit of `limit` bytes (SIGXFSZ ignored,
// as fp8lab's program does, so that a write past it fails with EFBIG); its exit status:
// 0 when `f` threw Error, 1 when it returned, 2 when it threw something else.
int under_file_size_limit(rlim_t limit, const std::function<void()>& f) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    rlimit r{limit, limit};
    ::setrlimit(RLIMIT_FSIZE, &r);
    int code = 1;
    try {
      f();
    } catch (const Error&) {
      code = 0;
    } catch (...) {
      code = 2;
    }
    ::_exit(code);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status);
}
}  // namespace

// A set of files is written all or nothing: when the second cannot be written (past a
// file-size limit), the first is not replaced either, and no temporary stays behind.
TEST(Files, ASetOfFilesIsWrittenWholeOrNotAtAll) {
  const fs::path d = test::temp_dir("fp8lab_files") / "set";
  fs::remove_all(d);
  fs::create_directories(d);
  const std::string a = (d / "a.npy").string(), b = (d / "b.npy").string();
  write_files_atomic({{a, "old a"}, {b, "old b"}});
  EXPECT_EQ(read_file(a), "old a");
  EXPECT_EQ(read_file(b), "old b");
  const std::string big(4096, 'x');
  EXPECT_EQ(under_file_size_limit(1024, [&] { write_files_atomic({{a, "new a"}, {b, big}}); }), 0);
  EXPECT_EQ(read_file(a), "old a");
  EXPECT_EQ(read_file(b), "old b");
  EXPECT_EQ(names_in(d), (std::vector<std::string>{"a.npy", "b.npy"}));
  // The single-file writer fails the same way, cleanly.
  EXPECT_EQ(under_file_size_limit(1024, [&] { write_file_atomic(b, big); }), 0);
  EXPECT_EQ(read_file(b), "old b");
  EXPECT_EQ(names_in(d), (std::vector<std::string>{"a.npy", "b.npy"}));
  write_files_atomic({{a, "new a"}, {b, big}});
  EXPECT_EQ(read_file(a), "new a");
  EXPECT_EQ(read_file(b), big);
  EXPECT_NE(error_of([&] { write_files_atomic({{a, "x"}, {d.string(), "y"}}); }).find("is a folder"),
            std::string::npos);
  EXPECT_EQ(read_file(a), "new a");
}

// Temporaries that a killed process of this host left beside a file are removed by the next
// write of that file; a live process's, another host's and other files' stay.
TEST(Files, StaleTemporariesOfEndedProcessesAreRemoved) {
  const fs::path d = test::temp_dir("fp8lab_files") / "stale";
  fs::remove_all(d);
  fs::create_directories(d);
  char host[256] = {};
  ASSERT_EQ(::gethostname(host, sizeof host - 1), 0);
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ::waitpid(dead, nullptr, 0);
  const std::string h(host), out = "out.npy";
  const std::string stale = out + ".tmp." + h + "." + std::to_string(dead) + ".0.7";
  const std::string live = out + ".tmp." + h + "." + std::to_string(::getppid()) + ".0.7";
  const std::string remote = out + ".tmp.otherhost." + std::to_string(dead) + ".0.7";
  const std::string other = "other.npy.tmp." + h + "." + std::to_string(dead) + ".0.7";
  for (const auto& n : {stale, live, remote, other}) write_file_atomic((d / n).string(), std::string("partial"));
  write_file_atomic((d / out).string(), std::string("whole"));
  std::vector<std::string> want = {live, other, out, remote};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(names_in(d), want);
}
