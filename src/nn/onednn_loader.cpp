// Loads libfp8lab_onednn.so (onednn/onednn_api.h) with its own symbol scope: RTLD_LOCAL
// keeps its oneDNN out of the process's global scope (where libtorch_cpu's oneDNN lives),
// RTLD_DEEPBIND makes it and its libdnnl.so.2 bind to their own symbols before any already
// loaded (docs/python.md "oneDNN").
#include <dlfcn.h>

#include <mutex>
#include <string>
#include <vector>

#include "compute_detail.hpp"

namespace fp8lab::nn::detail {

namespace {

constexpr const char* kLibrary = "libfp8lab_onednn.so";

// The folder of the object (program or shared library) this code was linked into: an
// installed package keeps the library beside its extension module.
std::string own_folder() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&own_folder), &info) == 0 || info.dli_fname == nullptr) return "";
  const std::string path = info.dli_fname;
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

// Where to look, in order: beside this object, then where the build put it.
std::vector<std::string> candidates() {
  std::vector<std::string> c;
  if (const std::string dir = own_folder(); !dir.empty()) c.push_back(dir + "/" + kLibrary);
#ifdef FP8LAB_ONEDNN_BUILD_PATH
  c.push_back(FP8LAB_ONEDNN_BUILD_PATH);
#endif
  return c;
}

const fp8lab_onednn_api* load(std::string& why) {
  for (const std::string& path : candidates()) {
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (handle == nullptr) {
      const char* e = dlerror();
      why += "\n  " + path + ": " + (e ? e : "not loaded");
      continue;
    }
    using Entry = const fp8lab_onednn_api* (*)();
    auto entry = reinterpret_cast<Entry>(dlsym(handle, "fp8lab_onednn"));
    const fp8lab_onednn_api* api = entry ? entry() : nullptr;
    if (api != nullptr && api->version == FP8LAB_ONEDNN_API_VERSION) return api;  // stays loaded
    why += "\n  " + path + ": not this build's library (no fp8lab_onednn entry of version " +
           std::to_string(FP8LAB_ONEDNN_API_VERSION) + ")";
    dlclose(handle);
  }
  return nullptr;
}

}  // namespace

const fp8lab_onednn_api& onednn() {
  static std::once_flag once;
  static const fp8lab_onednn_api* api = nullptr;
  static std::string why;
  std::call_once(once, [] { api = load(why); });
  if (api == nullptr) throw Error(std::string("bfloat16 products: cannot load ") + kLibrary + ":" + why);
  return *api;
}

void check_onednn(const char* message) {
  if (message != nullptr) throw Error(message);
}

}  // namespace fp8lab::nn::detail
