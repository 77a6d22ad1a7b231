#include "fp8lab/core/code_set.hpp"

#include <sys/stat.h>

#include <filesystem>
#include <map>
#include <sstream>

#include "fp8lab/core/files.hpp"
#include "fp8lab/core/error.hpp"

namespace fp8lab {

namespace {

constexpr const char* kMagic = "fp8lab-code-set 1";
constexpr std::uint64_t kManifestLimit = 1 << 16;  // a manifest is a few lines

std::string stem_of(const std::string& path) {
  return path.size() > 4 && path.ends_with(".npy") ? path.substr(0, path.size() - 4) : path;
}

std::string base_name(const std::string& path) { return std::filesystem::path(path).filename().string(); }

struct Part {
  std::string file;
  std::uint64_t bytes = 0, sum = 0;
};

struct Manifest {
  std::string format;
  int axis = 0;
  std::map<std::string, Part> parts;  // codes, scales, tensor_scale
};

std::string part_line(const std::string& role, const std::string& path, const std::string& bytes) {
  return role + " " + base_name(path) + " bytes=" + std::to_string(bytes.size()) +
         " fnv1a64=" + hex64(fnv1a(kFnvBasis, bytes.data(), bytes.size())) + "\n";
}

Manifest parse_manifest(const std::string& text, const std::string& path) {
  const std::string bad = path + ": not an fp8lab code-set manifest";
  std::istringstream in(text);
  std::string line;
  if (!std::getline(in, line) || line != kMagic) throw Error(bad + " (first line is not '" + kMagic + "')");
  Manifest m;
  bool have_format = false, have_axis = false;
  int n = 1;
  while (std::getline(in, line)) {
    ++n;
    std::istringstream ls(line);
    std::string key;
    ls >> key;
    const std::string where = bad + " (line " + std::to_string(n) + ")";
    if (key == "format" && !have_format) {
      if (!(ls >> m.format)) throw Error(where);
      have_format = true;
    } else if (key == "axis" && !have_axis) {
      if (!(ls >> m.axis) || m.axis < 0) throw Error(where);
      have_axis = true;
    } else if ((key == "codes" || key == "scales" || key == "tensor_scale") && !m.parts.count(key)) {
      Part p;
      std::string bytes, sum;
      if (!(ls >> p.file >> bytes >> sum) || bytes.rfind("bytes=", 0) != 0 || sum.rfind("fnv1a64=", 0) != 0)
        throw Error(where);
      try {
        std::size_t used = 0;
        p.bytes = std::stoull(bytes.substr(6), &used);
        if (used != bytes.size() - 6) throw Error(where);
        p.sum = std::stoull(sum.substr(8), &used, 16);
        if (used != 16 || sum.size() != 24) throw Error(where);
      } catch (const std::logic_error&) {
        throw Error(where);
      }
      m.parts[key] = p;
    } else {
      throw Error(where);
    }
    std::string rest;
    if (ls >> rest) throw Error(bad + " (line " + std::to_string(n) + ")");
  }
  if (!have_format || !have_axis || !m.parts.count("codes") || !m.parts.count("scales"))
    throw Error(bad + " (a format, an axis, the codes and the scales are required)");
  return m;
}

// The bytes of one part, checked against the manifest's entry when there is one.
std::string read_part(const std::string& role, const std::string& path, const Manifest* m,
                      const std::string& manifest_path) {
  if (m) {
    const auto it = m->parts.find(role);
    if (it == m->parts.end())
      throw Error(manifest_path + ": the code set lists no " + role + " file, but its format has one");
    if (it->second.file != base_name(path))
      throw Error(manifest_path + ": the code set's " + role + " are in '" + it->second.file + "', not '" +
                  base_name(path) + "'");
  }
  std::string bytes = read_file(path);
  if (m) {
    const Part& p = m->parts.at(role);
    const std::uint64_t sum = fnv1a(kFnvBasis, bytes.data(), bytes.size());
    if (bytes.size() != p.bytes || sum != p.sum)
      throw Error(path + ": does not belong to the code set " + manifest_path + " (" + std::to_string(bytes.size()) +
                  " bytes, checksum " + hex64(sum) + "; the set was written with " + std::to_string(p.bytes) +
                  " bytes, " + hex64(p.sum) + "): the file was replaced or comes from another set");
  }
  return bytes;
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

}  // namespace

CodeSetFiles code_set_files(const std::string& codes_path) {
  const std::string stem = stem_of(codes_path);
  return {codes_path, stem + ".scales.npy", stem + ".tensor_scale.npy", stem + ".codeset"};
}

std::vector<std::string> code_set_paths(const std::string& path, bool tensor_scale) {
  const CodeSetFiles f = code_set_files(path);
  std::vector<std::string> v = {f.codes, f.scales, f.manifest};
  if (tensor_scale) v.push_back(f.tensor_scale);
  return v;
}

void write_code_set(const std::string& path, const std::string& format, int axis, const CodeSet& set) {
  const CodeSetFiles f = code_set_files(path);
  const std::string codes = npy_bytes(set.codes, f.codes), scales = npy_bytes(set.scales, f.scales);
  const std::string ts = set.tensor_scale ? npy_bytes(*set.tensor_scale, f.tensor_scale) : std::string();
  std::string manifest = std::string(kMagic) + "\nformat " + format + "\naxis " + std::to_string(axis) + "\n";
  manifest += part_line("codes", f.codes, codes) + part_line("scales", f.scales, scales);
  if (set.tensor_scale) manifest += part_line("tensor_scale", f.tensor_scale, ts);
  std::vector<FileWrite> files = {{f.manifest, manifest}, {f.scales, scales}};
  if (set.tensor_scale) files.push_back({f.tensor_scale, ts});
  files.push_back({f.codes, codes});
  write_files_atomic(files);
}

CodeSet read_code_set(const std::string& path, const std::string& format, int axis, bool tensor_scale) {
  const CodeSetFiles f = code_set_files(path);
  std::optional<Manifest> m;
  if (exists(f.manifest)) {
    if (regular_file_size(f.manifest) > kManifestLimit)
      throw Error(f.manifest + ": not an fp8lab code-set manifest (larger than " + std::to_string(kManifestLimit) +
                  " bytes)");
    m = parse_manifest(read_file(f.manifest), f.manifest);
    if (m->format != format)
      throw Error(path + ": the code set was written for " + m->format + ", not " + format + " (" + f.manifest + ")");
    if (m->axis != axis)
      throw Error(path + ": the code set's groups run along axis " + std::to_string(m->axis) + ", not " +
                  std::to_string(axis) + " (" + f.manifest + "; pass --axis " + std::to_string(m->axis) + ")");
    if (!tensor_scale && m->parts.count("tensor_scale"))
      throw Error(f.manifest + ": the code set lists a tensor scale, which " + format + " does not have");
  }
  const Manifest* mp = m ? &*m : nullptr;
  CodeSet s;
  s.codes = parse_npy(read_part("codes", f.codes, mp, f.manifest), f.codes);
  s.scales = parse_npy(read_part("scales", f.scales, mp, f.manifest), f.scales);
  if (tensor_scale) s.tensor_scale = parse_npy(read_part("tensor_scale", f.tensor_scale, mp, f.manifest), f.tensor_scale);
  return s;
}

}  // namespace fp8lab
