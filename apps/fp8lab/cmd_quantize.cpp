// fp8lab quantize: fake-quantize, encode or decode a .npy array.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "commands.hpp"
#include "fp8lab/core/codec.hpp"
#include "fp8lab/core/format.hpp"
#include "fp8lab/core/files.hpp"
#include "fp8lab/core/npy.hpp"
#include "fp8lab/kernels/kernels.hpp"

namespace fp8lab::cli {

namespace {
struct QuantizeArgs {
  std::string input, output, format;
  std::string rounding = "nearest-even";
  std::string overflow = "saturate";
  std::uint64_t seed = 0;
  int random_bits = 32;
  bool codes = false;
  bool decode = false;
  int threads = 0;
  bool quiet = false;
};

void run_quantize(const QuantizeArgs& a) {
  QuantSpec q;
  q.format = parse_format(a.format);
  q.rounding = parse_rounding(a.rounding);
  q.overflow = parse_overflow(a.overflow);
  q.seed = a.seed;
  if (a.random_bits < 1 || a.random_bits > 32) throw Error("--random-bits must be in 1..32");
  q.random_bits = static_cast<std::uint8_t>(a.random_bits);
  validate(q);
  if (a.codes && a.decode) throw Error("--codes and --decode exclude each other");
  if (a.codes || a.decode) require_codable(q.format);
  if (a.threads < 0) throw Error("--threads must be >= 0 (0: all cores)");
  if (a.threads > 0) kernels::set_num_threads(a.threads);
  if (a.input == a.output || same_file(a.input, a.output))
    throw Error("output must differ from input: '" + a.output + "' is the file '" + a.input + "'");

  const NpyArray in = read_npy(a.input);
  NpyArray out;
  out.shape = in.shape;
  out.fortran_order = in.fortran_order;
  const std::size_t n = in.size();
  QuantCounts counts;
  const auto t0 = std::chrono::steady_clock::now();
  if (a.decode) {
    const DType want = q.format.width() <= 8 ? DType::u8 : DType::u16;
    if (in.dtype != want)
      throw Error(a.input + ": --decode of " + to_string(q.format) + " codes needs dtype " +
                  npy_descr(want) + ", the file has " + npy_descr(in.dtype));
    out.dtype = DType::f32;
    out.data.resize(n * 4);
    if (want == DType::u8)
      kernels::decode(in.data.data(), reinterpret_cast<float*>(out.data.data()), n, q.format);
    else
      kernels::decode(reinterpret_cast<const std::uint16_t*>(in.data.data()),
                      reinterpret_cast<float*>(out.data.data()), n, q.format);
  } else {
    if (in.dtype != DType::f32)
      throw Error(a.input + ": dtype " + npy_descr(in.dtype) +
                  " is not float32 ('<f4'); convert it first, or use --decode for codes");
    const float* x = reinterpret_cast<const float*>(in.data.data());
    if (a.codes) {
      out.dtype = q.format.width() <= 8 ? DType::u8 : DType::u16;
      out.data.resize(n * itemsize(out.dtype));
      if (out.dtype == DType::u8)
        kernels::encode(x, out.data.data(), n, q, 0, &counts);
      else
        kernels::encode(x, reinterpret_cast<std::uint16_t*>(out.data.data()), n, q, 0, &counts);
    } else {
      out.dtype = DType::f32;
      out.data.resize(n * 4);
      kernels::quantize(x, reinterpret_cast<float*>(out.data.data()), n, q, 0, &counts);
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  write_npy(a.output, out);
  if (!a.quiet) {
    if (a.decode)
      std::fprintf(stderr, "decoded %zu %s codes in %.3f s -> %s\n", n,
                   to_string(q.format).c_str(), secs, a.output.c_str());
    else
      std::fprintf(stderr,
                   "%s %zu values to %s (%s, %s): overflow %llu, flushed to zero %llu, NaN %llu; "
                   "%.3f s -> %s\n",
                   a.codes ? "encoded" : "quantized", n, to_string(q.format).c_str(),
                   std::string(to_string(q.rounding)).c_str(),
                   std::string(to_string(q.overflow)).c_str(),
                   static_cast<unsigned long long>(counts.overflow),
                   static_cast<unsigned long long>(counts.underflow),
                   static_cast<unsigned long long>(counts.nan), secs, a.output.c_str());
  }
}
}  // namespace

void register_quantize(CLI::App& app) {
  auto args = std::make_shared<QuantizeArgs>();
  auto* cmd = app.add_subcommand(
      "quantize", "Quantize a float32 .npy array (fake-quantized float32, or raw codes)");
  cmd->add_option("input", args->input, "Input .npy (float32; codes with --decode)")->required();
  cmd->add_option("output", args->output, "Output .npy (written atomically)")->required();
  cmd->add_option("-f,--format", args->format, "Format, e.g. 1.4.3:10 or e4m3fn")->required();
  cmd->add_option("-r,--rounding", args->rounding, "nearest-even, toward-zero or stochastic")
      ->capture_default_str();
  cmd->add_option("-o,--overflow", args->overflow, "saturate, nan or inf")->capture_default_str();
  cmd->add_option("--seed", args->seed, "Stochastic rounding seed")->capture_default_str();
  cmd->add_option("--random-bits", args->random_bits, "Random bits for stochastic rounding (1-32)")
      ->capture_default_str();
  cmd->add_flag("--codes", args->codes, "Write the codes (uint8, or uint16 above 8 bits)");
  cmd->add_flag("--decode", args->decode, "Input holds codes: write their float32 values");
  cmd->add_option("--threads", args->threads, "Threads (0: all cores)")->capture_default_str();
  cmd->add_flag("-q,--quiet", args->quiet, "No summary on stderr");
  cmd->callback([args] { run_quantize(*args); });
}

}  // namespace fp8lab::cli
