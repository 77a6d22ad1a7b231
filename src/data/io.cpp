// The data loaders' file helpers (io.hpp): torch-free, so the byte parsers can be fuzzed
// on their own.
#include "io.hpp"

#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "fp8lab/core/error.hpp"
#include "fp8lab/core/files.hpp"

namespace fp8lab::data::io {

void fail(const std::string& path, std::uint64_t offset, const std::string& what) {
  throw Error(path + ": offset " + std::to_string(offset) + ": " + what);
}

// gzread passes plain files through unchanged. Only a regular file is read (a FIFO would
// hang, /dev/zero never end), and what it inflates to may take at most the memory budget (a
// small gzip file can inflate to more than the machine holds).
std::vector<std::uint8_t> slurp(const std::string& path) {
  regular_file_size(path);
  const std::uint64_t budget = memory_budget();
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) throw Error(path + ": cannot open (" + std::strerror(errno) + ")");
  std::unique_ptr<std::remove_pointer_t<gzFile>, int (*)(gzFile)> guard(f, gzclose);
  std::vector<std::uint8_t> out;
  std::uint8_t buf[1 << 16];
  for (;;) {
    const int n = gzread(f, buf, sizeof buf);
    if (n < 0) {
      int err = 0;
      const char* msg = gzerror(f, &err);
      fail(path, out.size(), std::string("corrupt compressed data (") + msg + ")");
    }
    if (n == 0) break;
    if (out.size() + static_cast<std::size_t>(n) > budget)
      fail(path, out.size(), "inflates to more than the " + std::to_string(budget) +
                                 " bytes (half the memory) one input may take");
    out.insert(out.end(), buf, buf + n);
  }
  return out;
}

namespace {
std::uint32_t be32(const std::uint8_t* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) | p[3];
}
}  // namespace

IdxArray parse_idx(const std::vector<std::uint8_t>& bytes, const std::string& path, int expected_rank) {
  if (bytes.size() < 4) fail(path, 0, "file is " + std::to_string(bytes.size()) + " bytes, too short for an IDX header");
  if (bytes[0] != 0 || bytes[1] != 0) fail(path, 0, "bad magic: not an IDX file");
  if (bytes[2] != 0x08) fail(path, 2, "element type 0x" + std::to_string(bytes[2]) + " is not unsigned byte (0x08)");
  const int rank = bytes[3];
  if (rank < 1 || rank > 4) fail(path, 3, "rank " + std::to_string(rank) + " is not in 1..4");
  if (expected_rank > 0 && rank != expected_rank)
    fail(path, 3, "rank " + std::to_string(rank) + ", expected " + std::to_string(expected_rank));
  const std::size_t header = 4 + 4 * static_cast<std::size_t>(rank);
  if (bytes.size() < header) fail(path, 4, "truncated header");
  IdxArray a;
  std::uint64_t count = 1;
  for (int i = 0; i < rank; ++i) {
    const std::uint32_t d = be32(&bytes[4 + 4 * i]);
    if (d == 0 || d > (1u << 28)) fail(path, 4 + 4 * i, "dimension " + std::to_string(d) + " out of range");
    a.dims.push_back(d);
    count *= d;
    if (count > (std::uint64_t{1} << 34)) fail(path, 4 + 4 * i, "array too large");
  }
  if (bytes.size() - header < count)
    fail(path, header, "data holds " + std::to_string(bytes.size() - header) + " bytes but the dimensions need " +
                           std::to_string(count) + " (file truncated?)");
  if (bytes.size() - header > count)
    fail(path, header + count, std::to_string(bytes.size() - header - count) + " unexpected bytes after the data");
  a.data.assign(bytes.begin() + static_cast<std::ptrdiff_t>(header), bytes.end());
  return a;
}

void parse_cifar(const std::vector<std::uint8_t>& b, const std::string& path, int classes,
                 std::vector<std::uint8_t>& labels, std::vector<std::uint8_t>& pixels) {
  if (classes != 10 && classes != 100) throw Error("CIFAR has 10 or 100 classes, not " + std::to_string(classes));
  const std::size_t label_bytes = classes == 10 ? 1 : 2;
  const std::size_t record = label_bytes + kCifarPixels;
  if (b.empty()) fail(path, 0, "file is empty");
  if (b.size() % record != 0)
    fail(path, b.size() - b.size() % record,
         "file size " + std::to_string(b.size()) + " is not a multiple of the record size " + std::to_string(record) +
             " (truncated?)");
  for (std::size_t off = 0; off < b.size(); off += record) {
    const std::uint8_t lab = b[off + label_bytes - 1];
    if (lab >= classes)
      fail(path, off + label_bytes - 1, "label " + std::to_string(lab) + " is not below " + std::to_string(classes));
    if (classes == 100 && b[off] >= 20) fail(path, off, "coarse label " + std::to_string(b[off]) + " is not below 20");
    labels.push_back(lab);
    pixels.insert(pixels.end(), b.begin() + static_cast<std::ptrdiff_t>(off + label_bytes),
                  b.begin() + static_cast<std::ptrdiff_t>(off + record));
  }
}

}  // namespace fp8lab::data::io
