// Two run-time settings that decide libtorch's speed on small machines and can only be made
// before the libraries load, through the environment:
//  - OpenBLAS picks its kernels from the CPU model. Debian's OpenBLAS 0.3.21 does not know
//    some recent Xeons (this machine's among them) and falls back to its oldest x86-64
//    kernels ("Prescott", SSE3): libtorch's matmuls run 2x slower than with the AVX-512
//    ones. Fix: OPENBLAS_CORETYPE=SkylakeX (or Haswell with AVX2 only).
//  - libtorch's OpenMP threads spin for a long time after each parallel region, while
//    OpenBLAS's own threads need the same 2 cores: a Transformer step ran 2.5x slower.
//    Fix: GOMP_SPINCOUNT=10000 (convolutions, which run on OpenMP, keep their speed).
// A program calls fix_blas_kernels(argv) first thing in main: when a setting would help and
// the user has not made it, it sets it and re-executes itself once. FP8LAB_KEEP_BLAS=1
// turns this off.
#pragma once

#include <string>

namespace fp8lab::nn {

// The OpenBLAS core in use ("" when the BLAS is not OpenBLAS).
std::string blas_core();

// Re-executes the program with OPENBLAS_CORETYPE set when that helps; returns otherwise.
void fix_blas_kernels(char** argv);

}  // namespace fp8lab::nn
