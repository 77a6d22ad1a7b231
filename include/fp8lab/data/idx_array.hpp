// An IDX array of unsigned bytes, as read from an IDX file (fp8lab/data/idx.hpp).
#pragma once

#include <cstdint>
#include <vector>

namespace fp8lab::data {

struct IdxArray {
  std::vector<std::uint32_t> dims;
  std::vector<std::uint8_t> data;  // unsigned bytes (type code 0x08), row-major
};

}  // namespace fp8lab::data
