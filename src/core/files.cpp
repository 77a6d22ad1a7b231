#include "fp8lab/core/files.hpp"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <charconv>
#include <filesystem>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <random>

#include "fp8lab/core/error.hpp"

namespace fp8lab {

namespace {

namespace fs = std::filesystem;

// This host's name as it may appear in a file name ("host" where it has other characters).
const std::string& host_tag() {
  static const std::string tag = [] {
    char buf[256] = {};
    if (::gethostname(buf, sizeof buf - 1) != 0) return std::string("host");
    std::string h(buf);
    const bool plain = !h.empty() && std::all_of(h.begin(), h.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_';
    });
    return plain ? h : std::string("host");
  }();
  return tag;
}

// A name no other writer of `path` uses at the same time: this host and process, a
// per-process counter (threads) and a random number (a process with a recycled pid).
std::string temporary_name(const std::string& path) {
  static std::atomic<std::uint64_t> counter{0};
  static const std::uint64_t salt = std::random_device{}();
  return path + ".tmp." + host_tag() + "." + std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1)) +
         "." + std::to_string(salt);
}

// Removes the temporaries of `path` that a process of this host left when it was killed
// (its pid no longer runs). Temporaries of live processes and of other hosts (a shared
// file system) stay; what cannot be removed stays too.
void remove_stale_temporaries(const std::string& path) {
  const fs::path p(path);
  const std::string prefix = p.filename().string() + ".tmp." + host_tag() + ".";
  std::error_code ec;
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    long pid = 0;
    const char* first = name.data() + prefix.size();
    const auto r = std::from_chars(first, name.data() + name.size(), pid);
    if (r.ec != std::errc() || r.ptr == first || *r.ptr != '.' || pid <= 0 || pid == ::getpid()) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // alive, or not ours to judge
    std::error_code rm;
    fs::remove(it->path(), rm);
  }
}

// Writes the bytes to an existing file that is not a regular one (a device such as
// /dev/null, a FIFO) in place: renaming over it would replace the device or pipe.
void write_in_place(const std::string& path, const void* bytes, std::size_t n) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "wb"), std::fclose);
  if (!f) throw Error(path + ": cannot open for writing (" + std::strerror(errno) + ")");
  if ((n != 0 && std::fwrite(bytes, 1, n, f.get()) != n) || std::fflush(f.get()) != 0)
    throw Error(path + ": write failed (" + std::strerror(errno) + ")");
}

// Writes `bytes` to a fresh temporary of `path`, flushed to disk; returns its name. On
// failure the temporary is removed and Error names `path` and the reason.
std::string write_temporary(const std::string& path, const void* bytes, std::size_t n) {
  remove_stale_temporaries(path);
  const std::string tmp = temporary_name(path);
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw Error(path + ": cannot create temporary file (" + std::strerror(errno) + ")");
  bool ok = (n == 0 || std::fwrite(bytes, 1, n, f) == n);
  int err = ok ? 0 : errno;
  if (std::fflush(f) != 0 && ok) ok = false, err = errno;
  if (::fsync(::fileno(f)) != 0 && ok) ok = false, err = errno;
  if (std::fclose(f) != 0 && ok) ok = false, err = errno;
  if (!ok) {
    std::remove(tmp.c_str());
    throw Error(path + ": write failed (" + std::strerror(err ? err : EIO) + ")");
  }
  return tmp;
}

void commit_temporary(const std::string& tmp, const std::string& path) {
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    throw Error(path + ": write failed (" + why + ")");
  }
}

// Where a write of `path` goes: a symbolic link's target (the link stays), and whether it
// is an existing device or pipe to write in place. A folder is an error.
struct Target {
  std::string path;
  bool in_place = false;
};
Target target_of(const std::string& path) {
  Target t{path, false};
  std::error_code ec;
  if (fs::is_symlink(path, ec)) {
    t.path = fs::weakly_canonical(path, ec).string();
    if (ec) throw Error(path + ": cannot resolve the symbolic link (" + ec.message() + ")");
  }
  struct stat st {};
  if (::stat(t.path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) throw Error(path + ": is a folder");
    t.in_place = !S_ISREG(st.st_mode);
  }
  return t;
}

}  // namespace

void write_file_atomic(const std::string& path, const void* bytes, std::size_t n) {
  const Target t = target_of(path);
  if (t.in_place) return write_in_place(t.path, bytes, n);
  commit_temporary(write_temporary(t.path, bytes, n), t.path);
}

void write_files_atomic(const std::vector<FileWrite>& files) {
  std::vector<Target> targets;
  for (const auto& f : files) {
    targets.push_back(target_of(f.path));
    // A device or pipe is written in place, at once: it cannot wait with the others for the
    // renames, so a set holding one would not be all or nothing.
    if (targets.back().in_place && files.size() > 1)
      throw Error(f.path + ": is not a regular file (a device or pipe); the " + std::to_string(files.size()) +
                  " files of one result are written together, all or none, which a device cannot take part in: "
                  "give the path of a file");
  }
  std::vector<std::string> temps(files.size());
  try {
    for (std::size_t i = 0; i < files.size(); ++i)
      if (!targets[i].in_place) temps[i] = write_temporary(targets[i].path, files[i].bytes.data(), files[i].bytes.size());
  } catch (...) {
    for (const auto& t : temps)
      if (!t.empty()) std::remove(t.c_str());
    throw;
  }
  for (std::size_t i = 0; i < files.size(); ++i) {
    try {
      if (targets[i].in_place) write_in_place(targets[i].path, files[i].bytes.data(), files[i].bytes.size());
      else commit_temporary(temps[i], targets[i].path);
    } catch (...) {
      for (std::size_t j = i + 1; j < files.size(); ++j)
        if (!temps[j].empty()) std::remove(temps[j].c_str());
      throw;
    }
  }
}

void check_file_name(const std::string& name, const std::string& what) {
  const auto allowed = [](unsigned char c) { return std::isalnum(c) || c == '.' || c == '_' || c == '-' || c == '+'; };
  const bool ok = !name.empty() && name.size() <= 128 && name.front() != '.' && name.front() != '-' &&
                  std::all_of(name.begin(), name.end(), [&](char c) { return allowed(static_cast<unsigned char>(c)); });
  if (!ok)
    throw Error(what + " '" + name + "' cannot name a file: use 1-128 letters, digits, '.', '_', '-' or '+', "
                "not starting with '.' or '-'");
}

void make_folder(const std::string& path) {
  std::error_code ec;
  fs::create_directories(path, ec);
  if (!ec) return;
  // The first part of the path that exists and is not a folder, if that is what stopped it.
  for (fs::path p = path; !p.empty(); p = p.parent_path()) {
    std::error_code e2;
    if (fs::exists(p, e2) && !fs::is_directory(p, e2))
      throw Error(p.string() + ": exists and is not a folder (a folder is needed for " + path + ")");
    if (p == p.parent_path()) break;
  }
  throw Error(path + ": cannot make the folder (" + ec.message() + ")");
}

bool same_file(const std::string& a, const std::string& b) {
  struct stat sa {}, sb {};
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

std::uint64_t regular_file_size(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw Error(path + ": cannot open (" + std::strerror(errno) + ")");
  if (S_ISDIR(st.st_mode)) throw Error(path + ": is a folder, not a file");
  if (!S_ISREG(st.st_mode)) throw Error(path + ": is not a regular file (a device, pipe or socket)");
  return static_cast<std::uint64_t>(st.st_size);
}

std::uint64_t memory_budget() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return std::uint64_t{1} << 32;
  return static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page) / 2;
}

std::string read_file(const std::string& path) {
  const std::uint64_t size = regular_file_size(path);
  if (size > memory_budget())
    throw Error(path + ": " + std::to_string(size) + " bytes, more than the " + std::to_string(memory_budget()) +
                " bytes (half the memory) one input may take");
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), std::fclose);
  if (!f) throw Error(path + ": cannot open (" + std::strerror(errno) + ")");
  std::string out;
  char buf[1 << 16];
  std::size_t got;
  while ((got = std::fread(buf, 1, sizeof buf, f.get())) > 0) out.append(buf, got);
  if (std::ferror(f.get())) throw Error(path + ": read failed at offset " + std::to_string(out.size()));
  return out;
}

std::string hex64(std::uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

namespace {

// The unsigned number in `field` after `key` ("bytes=" in decimal, "fnv1a64=" in 16
// lower-case hex digits), written exactly as checksum_frame writes it.
std::optional<std::uint64_t> frame_number(std::string_view field, std::string_view key, int base) {
  if (field.substr(0, key.size()) != key) return std::nullopt;
  field.remove_prefix(key.size());
  if (field.empty() || (base == 16 && field.size() != 16)) return std::nullopt;
  std::uint64_t v = 0;
  const auto r = std::from_chars(field.data(), field.data() + field.size(), v, base);
  if (r.ec != std::errc() || r.ptr != field.data() + field.size()) return std::nullopt;
  if (field != (base == 16 ? hex64(v) : std::to_string(v))) return std::nullopt;  // as written: no '+', 'A', 007
  return v;
}

}  // namespace

std::string checksum_frame(std::string_view magic, std::string_view payload) {
  std::string out(magic);
  out += "bytes=" + std::to_string(payload.size()) + " fnv1a64=" +
         hex64(fnv1a(kFnvBasis, payload.data(), payload.size())) + "\n";
  out += payload;
  return out;
}

bool checksum_unframe(std::string& bytes, std::string_view magic, const std::string& path, const std::string& what) {
  if (bytes.compare(0, magic.size(), magic) != 0) return false;
  const std::string damaged = path + ": damaged " + what + ": ";
  const std::size_t nl = bytes.find('\n');
  if (nl == std::string::npos) throw Error(damaged + "unreadable header line");
  const std::string_view header = std::string_view(bytes).substr(magic.size(), nl - magic.size());
  const std::size_t space = header.find(' ');
  const auto size = frame_number(header.substr(0, space), "bytes=", 10);
  const auto sum = space == std::string_view::npos ? std::nullopt : frame_number(header.substr(space + 1), "fnv1a64=", 16);
  if (!size || !sum) throw Error(damaged + "unreadable header line");
  const std::size_t have = bytes.size() - nl - 1;
  if (have != *size)
    throw Error(damaged + std::to_string(have) + " bytes after the header, " + std::to_string(*size) +
                " written (truncated or appended to)");
  const std::uint64_t computed = fnv1a(kFnvBasis, bytes.data() + nl + 1, have);
  if (computed != *sum)
    throw Error(damaged + "checksum " + hex64(computed) + " where " + hex64(*sum) +
                " was written (the file changed after it was saved)");
  bytes.erase(0, nl + 1);  // in place: no second copy of the payload
  return true;
}

}  // namespace fp8lab
