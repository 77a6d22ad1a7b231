// Whole-file helpers shared by every layer: atomic writes (results, plots, checkpoints,
// run configs, the corpus), whole-file reads and a content hash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace fp8lab {

// Writes `bytes` to `path` atomically: a temporary file with a unique name in the same
// folder (`path.tmp.<host>.<pid>.<n>.<salt>`), flushed to disk, then renamed over `path`.
// On failure the temporary is removed, `path` is untouched and Error is thrown naming it.
// Temporaries of `path` left by processes of this host that have ended (killed before
// they could remove them) are removed first. A symbolic link is followed (its
// target is replaced, the link kept); an existing file that is not a regular one (a device
// such as /dev/null, a FIFO) is written in place, never replaced; a folder is an error.
void write_file_atomic(const std::string& path, const void* bytes, std::size_t n);
inline void write_file_atomic(const std::string& path, const std::string& text) {
  write_file_atomic(path, text.data(), text.size());
}

// Several files written as one result (a scaled format's codes and their side files): each
// is first written in full to a temporary beside its path and flushed to disk; only when
// every one is, they are renamed over their paths, in the order given. On a failure before
// the renames (a full disk, a file-size limit) every temporary is removed and no path is
// changed. Paths follow symbolic links as write_file_atomic does. A path that is an
// existing device or pipe (which is written in place, never renamed over) is refused in a
// set of several files before anything is written; a set of one writes it in place.
struct FileWrite {
  std::string path;
  std::string_view bytes;
};
void write_files_atomic(const std::vector<FileWrite>& files);

// Whether two paths name the same existing file (same device and inode), whatever their
// names.
bool same_file(const std::string& a, const std::string& b);

// Makes the folder `path` and its parents where missing; throws Error naming the path and
// the reason (a file in the way: "exists and is not a folder"; permissions; a full disk).
void make_folder(const std::string& path);

// How many bytes one input file may bring into memory: half of the machine's physical
// memory. Files read whole (.npy arrays, configs, checkpoints) above it are refused.
std::uint64_t memory_budget();

// The whole file as bytes; throws Error naming the file when it cannot be read or is not a
// regular file (a folder, a device, a pipe).
std::string read_file(const std::string& path);

// The size of a regular file; throws Error naming it when it is missing or is not a
// regular file (a folder, a device, a pipe).
std::uint64_t regular_file_size(const std::string& path);

// Throws Error unless `name` can be used as one file name inside the working folder: 1-128
// characters from letters, digits, '.', '_', '-' and '+', not starting with '.' or '-' (so
// no "..", no '/', no hidden or option-like names). `what` names it in the error.
void check_file_name(const std::string& name, const std::string& what);

// FNV-1a over `n` bytes, continued from `h` (start with kFnvBasis).
inline constexpr std::uint64_t kFnvBasis = 0xcbf29ce484222325ULL;
inline std::uint64_t fnv1a(std::uint64_t h, const void* data, std::size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ULL;
  return h;
}

// `v` as 16 lower-case hex digits (checksums, config keys, cache names).
std::string hex64(std::uint64_t v);

// A payload behind one header line that records its length and checksum:
// "<magic>bytes=<N> fnv1a64=<16 hex digits>\n" then the N bytes (checkpoints use it).
std::string checksum_frame(std::string_view magic, std::string_view payload);
// Undoes checksum_frame in place: `bytes` becomes the payload once the header line has been
// read and the length and checksum agree. Bytes that do not start with `magic` are left as
// they are and false is returned (an older file without the frame); any other header, a
// length or a checksum that differs, is an Error "<path>: damaged <what>: ...".
bool checksum_unframe(std::string& bytes, std::string_view magic, const std::string& path, const std::string& what);

}  // namespace fp8lab
