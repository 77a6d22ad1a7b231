// Reading and writing NumPy .npy arrays (format versions 1.0, 2.0 and 3.0): the exchange
// format every NumPy and PyTorch user can load. Writes are atomic (temp file + rename).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace fp8lab {

enum class DType : std::uint8_t { f32, u8, u16 };
std::size_t itemsize(DType t);
const char* npy_descr(DType t);  // "<f4", "|u1", "<u2"

struct NpyArray {
  DType dtype = DType::f32;
  std::vector<std::size_t> shape;
  bool fortran_order = false;
  std::vector<std::uint8_t> data;  // little-endian element bytes
  std::size_t size() const;        // number of elements
};

// Throws Error naming the file, the problem and the byte offset where it was found.
NpyArray read_npy(const std::string& path);
// The same from the file's bytes; `name` names them in errors.
NpyArray parse_npy(std::string_view bytes, const std::string& name);
// The array as the bytes of a .npy file (version 1.0); `name` names it in errors.
std::string npy_bytes(const NpyArray& a, const std::string& name);
// Throws Error on failure; a partially written file never replaces `path`.
void write_npy(const std::string& path, const NpyArray& a);

}  // namespace fp8lab
