// The environment fp8lab's programs start libtorch with. Two settings decide libtorch's
// speed on small machines and are read only when the libraries load (OpenBLAS and GNU
// OpenMP read them in their constructors), so they must be in the environment before
// libtorch is loaded, and no function called later can change them:
//  - OPENBLAS_CORETYPE: Debian's OpenBLAS 0.3.21 does not recognise some recent Xeons and
//    falls back to its oldest x86-64 kernels (Prescott, SSE3); libtorch's matmuls then run
//    at half speed. Set to SKYLAKEX on CPUs with AVX-512 (F, BW, VL, DQ), HASWELL on CPUs
//    with AVX2 and FMA: the kernel families OpenBLAS itself uses for every CPU of those
//    kinds that it recognises.
//  - GOMP_SPINCOUNT=10000: libtorch's OpenMP threads otherwise spin for a long time after
//    each parallel region while OpenBLAS's own threads wait for the same cores.
// A variable the user has set is left as it is (OMP_WAIT_POLICY also keeps GOMP_SPINCOUNT
// unset); FP8LAB_KEEP_BLAS=1 sets nothing.
//
// Used by the `fp8lab` launcher (before it loads the CLI module) and by `fp8lab-env`
// (which runs the test and benchmark programs); the library itself sets no variable.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace fp8lab::launcher {

// The variables to set (name, value), given this CPU and the current environment.
std::vector<std::pair<std::string, std::string>> recommended_environment();

}  // namespace fp8lab::launcher
