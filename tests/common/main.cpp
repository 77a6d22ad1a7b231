// The test binaries' main: the libtorch run-time settings of fp8lab's programs (see
// nn/blas.hpp), then GoogleTest.
#include <gtest/gtest.h>

#include "fp8lab/nn/blas.hpp"

int main(int argc, char** argv) {
  fp8lab::nn::fix_blas_kernels(argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
