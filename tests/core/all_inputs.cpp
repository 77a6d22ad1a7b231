// Every one of the 2^32 float32 inputs through the codec, the SIMD kernels and the
// independent reference, for the formats ml_dtypes also has (docs/spec.md §2), nearest-even with
// saturating and non-saturating overflow. Not part of the default test run (README.md gives
// its duration):
//
//   build/fp8lab_all_inputs [--stride N] [FORMAT...]
#include <atomic>
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../common/reference.hpp"
#include "fp8lab/core/codec.hpp"
#include "fp8lab/kernels/kernels.hpp"

using namespace fp8lab;

int main(int argc, char** argv) {
  std::uint64_t stride = 1;
  std::vector<std::string> names;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--stride") == 0 && i + 1 < argc) stride = std::strtoull(argv[++i], nullptr, 10);
    else names.emplace_back(argv[i]);
  }
  if (stride == 0) stride = 1;
  if (names.empty())
    names = {"e4m3fnuz", "e4m3b11fnuz", "e5m2fnuz", "e4m3fn", "e5m2",
             "e3m4",     "e2m3fn",      "e3m2fn",   "e2m1fn"};
  kernels::set_num_threads(1);  // parallelism comes from the workers below
  const unsigned workers = std::max(1u, std::thread::hardware_concurrency());
  std::uint64_t passed = 0, failed = 0;
  for (const auto& name : names) {
    Format f;
    try {
      f = parse_format(name);
      require_codable(f);
    } catch (const Error& e) {
      std::fprintf(stderr, "%s\n", e.what());
      return 2;
    }
    const ref::Table table(f);
    for (Overflow o : {Overflow::saturate, f.has_inf() ? Overflow::inf : Overflow::nan}) {
      QuantSpec q;
      q.format = f;
      q.overflow = o;
      std::atomic<std::uint64_t> bad{0};
      std::mutex print;
      auto work = [&](unsigned w) {
        constexpr std::uint64_t kBlock = 1 << 16;
        std::vector<float> x(kBlock);
        std::vector<std::uint16_t> codes(kBlock);
        const std::uint64_t total = (std::uint64_t{1} << 32);
        for (std::uint64_t start = w * kBlock * stride; start < total;
             start += std::uint64_t{workers} * kBlock * stride) {
          std::size_t n = 0;
          for (std::uint64_t k = 0; k < kBlock && start + k * stride < total; ++k)
            x[n++] = std::bit_cast<float>(static_cast<std::uint32_t>(start + k * stride));
          kernels::encode(x.data(), codes.data(), n, q);
          for (std::size_t i = 0; i < n; ++i) {
            const std::uint32_t c = encode(x[i], q), r = ref::encode(table, q, x[i], 0);
            if (c != r || codes[i] != c) {
              if (bad.fetch_add(1) < 5) {
                std::lock_guard<std::mutex> lk(print);
                std::fprintf(stderr, "%s %s: x=%a (0x%08x) codec 0x%x kernel 0x%x reference 0x%x\n",
                             name.c_str(), std::string(to_string(o)).c_str(), x[i],
                             std::bit_cast<std::uint32_t>(x[i]), c, codes[i], r);
              }
            }
          }
        }
      };
      std::vector<std::thread> ts;
      for (unsigned w = 0; w < workers; ++w) ts.emplace_back(work, w);
      for (auto& t : ts) t.join();
      std::printf("%-12s %-8s %s\n", name.c_str(), std::string(to_string(o)).c_str(),
                  bad ? "MISMATCH" : "all inputs agree");
      std::fflush(stdout);
      (bad ? failed : passed) += 1;
    }
  }
  std::printf("%llu passed, %llu failed\n", static_cast<unsigned long long>(passed),
              static_cast<unsigned long long>(failed));
  return failed ? 1 : 0;
}
