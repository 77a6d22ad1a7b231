// `fp8lab`: sets the environment libtorch must start with (process_env.hpp), loads the
// command-line program (the module libfp8lab_cli.so beside this executable) into this
// process and runs it. One process image: nothing is re-executed. The variables it set are
// removed again once the libraries that read them have loaded, so programs that fp8lab
// starts (a sweep's runs) see the user's environment.
#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "process_env.hpp"

namespace {

// The folder of this executable, with a trailing slash ("" if it cannot be found).
std::string own_folder() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "";
  const std::string path(buf, static_cast<std::size_t>(n));
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash + 1);
}

}  // namespace

int main(int argc, char** argv) {
  const auto env = fp8lab::launcher::recommended_environment();
  for (const auto& [name, value] : env) setenv(name.c_str(), value.c_str(), 1);
  const std::string module = own_folder() + "libfp8lab_cli.so";
  void* handle = dlopen(module.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    std::fprintf(stderr, "fp8lab: error: cannot load the command-line module: %s\n", dlerror());
    return 3;
  }
  for (const auto& [name, value] : env) unsetenv(name.c_str());
  using Main = int (*)(int, char**);
  const auto cli_main = reinterpret_cast<Main>(dlsym(handle, "fp8lab_cli_main"));
  if (!cli_main) {
    std::fprintf(stderr, "fp8lab: error: %s has no entry point fp8lab_cli_main\n", module.c_str());
    return 3;
  }
  return cli_main(argc, argv);
}
