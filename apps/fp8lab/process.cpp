#include "process.hpp"

#include <malloc.h>

namespace fp8lab::cli {

void setup_process() {
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

}  // namespace fp8lab::cli
