// `fp8lab-env PROGRAM [ARGS...]`: runs PROGRAM with the environment fp8lab's programs start
// libtorch with (process_env.hpp), like env(1). CTest runs the libtorch test programs
// through it; run the benchmarks the same way: `build/fp8lab-env build/bench_train`.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "process_env.hpp"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: fp8lab-env PROGRAM [ARGS...]\n");
    return 2;
  }
  for (const auto& [name, value] : fp8lab::launcher::recommended_environment())
    setenv(name.c_str(), value.c_str(), 1);
  execvp(argv[1], argv + 1);
  std::fprintf(stderr, "fp8lab-env: cannot run %s: %s\n", argv[1], std::strerror(errno));
  return 127;
}
