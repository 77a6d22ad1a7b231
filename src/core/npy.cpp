#include "fp8lab/core/npy.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <unistd.h>

#include "fp8lab/core/files.hpp"
#include "fp8lab/core/error.hpp"

namespace fp8lab {

std::size_t itemsize(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::u8: return 1;
    case DType::u16: return 2;
  }
  return 0;
}

const char* npy_descr(DType t) {
  switch (t) {
    case DType::f32: return "<f4";
    case DType::u8: return "|u1";
    case DType::u16: return "<u2";
  }
  return "?";
}

std::size_t NpyArray::size() const {
  std::size_t n = 1;
  for (std::size_t d : shape) n *= d;
  return n;
}

namespace {

[[noreturn]] void fail(const std::string& path, std::size_t offset, const std::string& what) {
  throw Error(path + ": offset " + std::to_string(offset) + ": " + what);
}

// Value of 'key' in the header dict, as raw text up to the next top-level ',' or '}'.
std::string dict_value(const std::string& path, std::size_t base, const std::string& h,
                       const std::string& key) {
  std::size_t k = h.find("'" + key + "'");
  if (k == std::string::npos) k = h.find("\"" + key + "\"");
  if (k == std::string::npos) fail(path, base, "header has no '" + key + "' entry");
  std::size_t colon = h.find(':', k + key.size() + 2);
  if (colon == std::string::npos) fail(path, base + k, "header entry '" + key + "' has no value");
  std::size_t i = colon + 1;
  while (i < h.size() && h[i] == ' ') ++i;
  std::size_t j = i;
  if (j < h.size() && h[j] == '(') {
    j = h.find(')', j);
    if (j == std::string::npos) fail(path, base + i, "unterminated shape tuple");
    return h.substr(i, j - i + 1);
  }
  while (j < h.size() && h[j] != ',' && h[j] != '}') ++j;
  std::string v = h.substr(i, j - i);
  while (!v.empty() && v.back() == ' ') v.pop_back();
  return v;
}

}  // namespace

NpyArray parse_npy(std::string_view bytes, const std::string& path) {
  const std::size_t file_size = bytes.size();
  const auto* p8 = reinterpret_cast<const unsigned char*>(bytes.data());
  if (file_size < 10) fail(path, 0, "file is " + std::to_string(file_size) + " bytes, too short for a .npy header");
  const unsigned char* pre = p8;
  if (std::memcmp(pre, "\x93NUMPY", 6) != 0) fail(path, 0, "not a .npy file (bad magic)");
  const int major = pre[6];
  std::size_t header_len, header_start;
  if (major == 1) {
    header_len = pre[8] | (pre[9] << 8);
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (file_size < 12) fail(path, 10, "truncated header length");
    const unsigned char* b = p8 + 10;
    header_len = pre[8] | (pre[9] << 8) | (static_cast<std::size_t>(b[0]) << 16) |
                 (static_cast<std::size_t>(b[1]) << 24);
    header_start = 12;
  } else {
    fail(path, 6, "unsupported .npy format version " + std::to_string(major));
  }
  if (header_start + header_len > file_size)
    fail(path, header_start, "header of " + std::to_string(header_len) +
                                 " bytes runs past the end of the file (truncated?)");
  const std::string h(bytes.substr(header_start, header_len));

  NpyArray a;
  std::string descr = dict_value(path, header_start, h, "descr");
  if (descr.size() >= 2 && (descr.front() == '\'' || descr.front() == '"'))
    descr = descr.substr(1, descr.size() - 2);
  if (descr == "<f4" || descr == "=f4") a.dtype = DType::f32;
  else if (descr == "|u1" || descr == "<u1" || descr == "u1") a.dtype = DType::u8;
  else if (descr == "<u2" || descr == "=u2") a.dtype = DType::u16;
  else
    fail(path, header_start + h.find("descr"),
         "dtype '" + descr + "' is not supported: expected float32 ('<f4'), uint8 or uint16");
  const std::string fo = dict_value(path, header_start, h, "fortran_order");
  if (fo == "True") a.fortran_order = true;
  else if (fo == "False") a.fortran_order = false;
  else fail(path, header_start + h.find("fortran_order"), "fortran_order is '" + fo + "'");
  const std::string shape = dict_value(path, header_start, h, "shape");
  if (shape.size() < 2 || shape.front() != '(' || shape.back() != ')')
    fail(path, header_start + h.find("shape"), "shape '" + shape + "' is not a tuple");
  std::size_t i = 1;
  while (i + 1 < shape.size()) {
    while (i + 1 < shape.size() && (shape[i] == ' ' || shape[i] == ',')) ++i;
    if (i + 1 >= shape.size()) break;
    std::size_t j = i;
    unsigned long long v = 0;
    while (j + 1 < shape.size() && std::isdigit(static_cast<unsigned char>(shape[j]))) {
      v = v * 10 + static_cast<unsigned>(shape[j] - '0');
      if (v > (1ull << 40)) fail(path, header_start + h.find("shape"), "dimension too large");
      ++j;
    }
    if (j == i) fail(path, header_start + h.find("shape"), "shape '" + shape + "' is malformed");
    a.shape.push_back(static_cast<std::size_t>(v));
    i = j;
  }
  const std::size_t data_start = header_start + header_len;
  const std::size_t have = file_size - data_start;
  // The element count and byte size are multiplied out with overflow checks; the size is
  // then checked against the bytes present before anything is allocated.
  const std::size_t item = itemsize(a.dtype);
  std::size_t count = 1;
  for (std::size_t d : a.shape)
    if (__builtin_mul_overflow(count, d, &count))
      fail(path, header_start + h.find("shape"), "shape " + shape + " has more elements than fit in 64 bits");
  std::size_t need = 0;
  if (__builtin_mul_overflow(count, item, &need))
    fail(path, header_start + h.find("shape"), "shape " + shape + " needs more bytes than fit in 64 bits");
  if (have < need)
    fail(path, data_start, "data holds " + std::to_string(have) + " bytes but the shape needs " +
                               std::to_string(need) + " (file truncated?)");
  if (have > need)
    fail(path, data_start + need, std::to_string(have - need) + " unexpected bytes after the data");
  a.data.assign(p8 + data_start, p8 + data_start + need);
  return a;
}

NpyArray read_npy(const std::string& path) { return parse_npy(read_file(path), path); }

std::string npy_bytes(const NpyArray& a, const std::string& path) {
  if (a.data.size() != a.size() * itemsize(a.dtype))
    throw Error(path + ": internal error: data size does not match shape");
  std::string dict = std::string("{'descr': '") + npy_descr(a.dtype) +
                     "', 'fortran_order': " + (a.fortran_order ? "True" : "False") +
                     ", 'shape': (";
  for (std::size_t i = 0; i < a.shape.size(); ++i)
    dict += std::to_string(a.shape[i]) + (a.shape.size() == 1 || i + 1 < a.shape.size() ? "," : "") +
            (i + 1 < a.shape.size() ? " " : "");
  dict += "), }";
  // Pad so that the data starts at a multiple of 64 bytes; the header ends with '\n'.
  std::size_t total = 10 + dict.size() + 1;
  const std::size_t pad = (64 - total % 64) % 64;
  dict.append(pad, ' ');
  dict += '\n';
  std::string out = "\x93NUMPY";
  out += static_cast<char>(1);
  out += static_cast<char>(0);
  if (dict.size() > 65535) throw Error(path + ": header too long for .npy version 1.0");
  out += static_cast<char>(dict.size() & 0xff);
  out += static_cast<char>(dict.size() >> 8);
  out += dict;
  out.append(reinterpret_cast<const char*>(a.data.data()), a.data.size());
  return out;
}

void write_npy(const std::string& path, const NpyArray& a) {
  const std::string bytes = npy_bytes(a, path);
  write_file_atomic(path, bytes.data(), bytes.size());
}

}  // namespace fp8lab
