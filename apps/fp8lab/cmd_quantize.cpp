// fp8lab quantize: fake-quantize, encode or decode a .npy array.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "commands.hpp"
#include "fp8lab/core/code_set.hpp"
#include "fp8lab/core/codec.hpp"
#include "fp8lab/core/format.hpp"
#include "fp8lab/core/files.hpp"
#include "fp8lab/core/machine.hpp"
#include "fp8lab/core/npy.hpp"
#include "fp8lab/core/scaled.hpp"
#include "fp8lab/kernels/kernels.hpp"
#include "fp8lab/kernels/scaled.hpp"

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
  int axis = -1;
  bool quiet = false;
};

// ---- scaled formats: groups along one axis (docs/spec.md §6.5) -------------------------

// The array as [outer, len, inner] around the axis the groups run along.
struct AxisView {
  std::size_t outer = 1, len = 1, inner = 1;
  std::size_t rows() const { return outer * inner; }
};

AxisView axis_view(const std::vector<std::size_t>& shape, int axis, const std::string& file) {
  const int nd = static_cast<int>(shape.size());
  const int a = axis < 0 ? axis + nd : axis;
  if (nd == 0)
    throw Error(file + ": a 0-d array has no axis for a scaled format's groups; save it with shape (1,)");
  if (a < 0 || a >= nd)
    throw Error("--axis " + std::to_string(axis) + " does not exist in " + file + " (" + std::to_string(nd) + " dimensions)");
  AxisView v;
  for (int d = 0; d < a; ++d) v.outer *= shape[d];
  v.len = shape[a];
  for (int d = a + 1; d < nd; ++d) v.inner *= shape[d];
  return v;
}

// [outer, len, inner] -> [outer, inner, len] (to_rows) and back (from_rows).
template <class T>
std::vector<T> to_rows(const T* x, const AxisView& v) {
  std::vector<T> t(v.outer * v.len * v.inner);
  for (std::size_t o = 0; o < v.outer; ++o)
    for (std::size_t l = 0; l < v.len; ++l)
      for (std::size_t i = 0; i < v.inner; ++i) t[(o * v.inner + i) * v.len + l] = x[(o * v.len + l) * v.inner + i];
  return t;
}
template <class T>
void from_rows(const T* t, T* x, const AxisView& v) {
  for (std::size_t o = 0; o < v.outer; ++o)
    for (std::size_t l = 0; l < v.len; ++l)
      for (std::size_t i = 0; i < v.inner; ++i) x[(o * v.len + l) * v.inner + i] = t[(o * v.inner + i) * v.len + l];
}

// The 0-based axis the groups run along.
int axis_index(int axis, const std::vector<std::size_t>& shape) {
  return axis < 0 ? axis + static_cast<int>(shape.size()) : axis;
}

// Throws Error when one of `outputs` is one of `inputs` (by name or as a file).
void check_outputs_differ(const std::vector<std::string>& outputs, const std::vector<std::string>& inputs) {
  for (const auto& o : outputs)
    for (const auto& i : inputs)
      if (o == i || same_file(o, i))
        throw Error("output must differ from input: the output's file '" + o + "' is the input '" + i + "'");
}

// The dtype and shape of the scales of codes of shape `shape`: the input's shape with the
// axis cut into groups (per line: length 1), [1] per tensor ([0] for an empty array), the
// 2-D grid of the [rows, len] view for tiles. scale_array writes them; --decode checks them.
NpyArray expected_scales(const ScaledSpec& s, const std::vector<std::size_t>& shape, int axis, const BlockLayout& l) {
  NpyArray a;
  a.dtype = s.scale == ScaleFormat::fp32 ? DType::f32 : DType::u8;
  if (s.granularity == Granularity::tensor) a.shape = {l.groups()};  // 1, or 0 for an empty array
  else if (s.granularity == Granularity::tile) a.shape = {l.grid_rows(), l.grid_cols()};
  else {
    a.shape = shape;
    a.shape[static_cast<std::size_t>(axis_index(axis, shape))] = l.grid_cols();
  }
  return a;
}

// The scale codes as an array of expected_scales' dtype and shape.
NpyArray scale_array(const ScaledSpec& s, const std::vector<std::uint32_t>& codes, const std::vector<std::size_t>& shape,
                     int axis, const BlockLayout& l, const AxisView& v) {
  NpyArray a = expected_scales(s, shape, axis, l);
  a.data.resize(codes.size() * itemsize(a.dtype));
  std::vector<std::uint32_t> ordered = codes;
  if (s.granularity == Granularity::block || s.granularity == Granularity::line)
    from_rows(codes.data(), ordered.data(), AxisView{v.outer, l.grid_cols(), v.inner});
  for (std::size_t i = 0; i < ordered.size(); ++i) {
    if (a.dtype == DType::u8) a.data[i] = static_cast<std::uint8_t>(ordered[i]);
    else std::memcpy(a.data.data() + 4 * i, &ordered[i], 4);
  }
  return a;
}

void print_scaled_summary(const ScaledSpec& s, const ScaledCounts& c, std::size_t n, double bits, double secs,
                          const std::string& output, bool codes) {
  std::fprintf(stderr,
               "%s %zu values to %s (%.3g bits per value): %llu groups, %llu saturated, %llu NaN, %llu zero; "
               "scale underflow %llu, overflow %llu; elements clamped %llu, flushed to zero %llu, NaN %llu; %.3f s -> %s\n",
               codes ? "encoded" : "quantized", n, to_string(s).c_str(), bits,
               static_cast<unsigned long long>(c.groups), static_cast<unsigned long long>(c.saturated_groups),
               static_cast<unsigned long long>(c.nan_groups), static_cast<unsigned long long>(c.zero_groups),
               static_cast<unsigned long long>(c.scale_underflow), static_cast<unsigned long long>(c.scale_overflow),
               static_cast<unsigned long long>(c.elements.overflow), static_cast<unsigned long long>(c.elements.underflow),
               static_cast<unsigned long long>(c.elements.nan), secs, output.c_str());
  if (s.history > 0) std::fprintf(stderr, "(delayed scaling without a history: the array's own amax was used)\n");
}


std::string shape_text(const std::vector<std::size_t>& shape) {
  std::string t = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) t += (i ? ", " : "") + std::to_string(shape[i]);
  return t + (shape.size() == 1 ? ",)" : ")");
}

// --decode of a scaled format: INPUT holds the element codes, INPUT.scales.npy their scales
// (and INPUT.tensor_scale.npy the tensor scale), as --codes wrote them (docs/spec.md §6.5).
void run_scaled_decode(const QuantizeArgs& a, const ScaledSpec& s) {
  const NpyArray in = read_npy(a.input);
  check_outputs_differ({a.output}, code_set_paths(a.input, s.tensor_scale));
  if (in.dtype != DType::u8)
    throw Error(a.input + ": --decode of " + to_string(s) + " codes needs dtype |u1, the file has " + npy_descr(in.dtype));
  if (in.fortran_order) throw Error(a.input + ": Fortran-ordered arrays are not supported for scaled formats");
  const AxisView v = axis_view(in.shape, a.axis, a.input);
  const BlockLayout l = block_layout(s, v.rows(), v.len);
  const CodeSet set = read_code_set(a.input, codes_name(s), axis_index(a.axis, in.shape), s.tensor_scale);
  const std::string scales_path = code_set_files(a.input).scales;
  const NpyArray& sc = set.scales;
  const NpyArray want = expected_scales(s, in.shape, a.axis, l);
  if (sc.dtype != want.dtype || sc.shape != want.shape || sc.fortran_order)
    throw Error(scales_path + ": the scales of " + a.input + " under " + to_string(s) + " are " + npy_descr(want.dtype) +
                " " + shape_text(want.shape) + " (C order), the file has " + npy_descr(sc.dtype) + " " + shape_text(sc.shape));
  check_codes(in.data.data(), in.size(), s.element.format, a.input);
  std::vector<std::uint32_t> ordered(l.groups());
  for (std::size_t i = 0; i < ordered.size(); ++i) {
    if (sc.dtype == DType::u8) ordered[i] = sc.data[i];
    else std::memcpy(&ordered[i], sc.data.data() + 4 * i, 4);
  }
  check_scale_codes(ordered.data(), ordered.size(), s, scales_path);
  std::vector<std::uint32_t> scales = ordered;
  if (s.granularity == Granularity::block || s.granularity == Granularity::line)
    scales = to_rows(ordered.data(), AxisView{v.outer, l.grid_cols(), v.inner});
  float ts = 1;
  if (s.tensor_scale) {
    const std::string ts_path = code_set_files(a.input).tensor_scale;
    const NpyArray& t = *set.tensor_scale;
    if (t.dtype != DType::f32 || t.size() != 1)
      throw Error(ts_path + ": the tensor scale is one float32 (<f4 (1,)), the file has " + npy_descr(t.dtype) + " " +
                  shape_text(t.shape));
    std::memcpy(&ts, t.data.data(), 4);
    check_tensor_scale(ts, s, ts_path);
  }
  const std::size_t n = in.size();
  const std::vector<std::uint8_t> rows = v.inner == 1 ? std::vector<std::uint8_t>() : to_rows(in.data.data(), v);
  std::vector<float> y(n);
  const auto t0 = std::chrono::steady_clock::now();
  kernels::scaled_decode(v.inner == 1 ? in.data.data() : rows.data(), scales.data(), ts, v.rows(), v.len, s, y.data());
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  NpyArray out{DType::f32, in.shape, false, std::vector<std::uint8_t>(n * 4)};
  if (v.inner == 1) std::memcpy(out.data.data(), y.data(), n * 4);
  else from_rows(y.data(), reinterpret_cast<float*>(out.data.data()), v);
  write_npy(a.output, out);
  if (!a.quiet)
    std::fprintf(stderr, "decoded %zu %s values in %.3f s -> %s\n", n, to_string(s).c_str(), secs, a.output.c_str());
}

void run_scaled_quantize(const QuantizeArgs& a, const ScaledSpec& s) {
  if (a.decode) return run_scaled_decode(a, s);
  if (a.codes) check_outputs_differ(code_set_paths(a.output, s.tensor_scale), {a.input});
  const NpyArray in = read_npy(a.input);
  if (in.dtype != DType::f32)
    throw Error(a.input + ": dtype " + std::string(npy_descr(in.dtype)) + " is not float32 ('<f4')");
  if (in.fortran_order) throw Error(a.input + ": Fortran-ordered arrays are not supported for scaled formats; save it in C order");
  const AxisView v = axis_view(in.shape, a.axis, a.input);
  const std::size_t n = in.size();
  const float* x = reinterpret_cast<const float*>(in.data.data());
  const std::vector<float> rows = v.inner == 1 ? std::vector<float>() : to_rows(x, v);
  const float* xr = v.inner == 1 ? x : rows.data();
  const BlockLayout l = block_layout(s, v.rows(), v.len);
  std::vector<float> y(n);
  std::vector<std::uint8_t> codes(a.codes ? n : 0);
  std::vector<std::uint32_t> scales(l.groups());
  float ts = 1;
  ScaledCounts counts;
  const auto t0 = std::chrono::steady_clock::now();
  kernels::scaled_quantize(xr, v.rows(), v.len, s, ScaledOut{y.data(), a.codes ? codes.data() : nullptr, scales.data(), &ts},
                           {}, &counts);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  NpyArray out;
  out.shape = in.shape;
  out.dtype = a.codes ? DType::u8 : DType::f32;
  out.data.resize(n * itemsize(out.dtype));
  if (a.codes) {
    if (v.inner == 1) std::memcpy(out.data.data(), codes.data(), n);
    else from_rows(codes.data(), out.data.data(), v);
    CodeSet set{std::move(out), scale_array(s, scales, in.shape, a.axis, l, v), std::nullopt};
    if (s.tensor_scale) {
      set.tensor_scale = NpyArray{DType::f32, {1}, false, std::vector<std::uint8_t>(4)};
      std::memcpy(set.tensor_scale->data.data(), &ts, 4);
    }
    write_code_set(a.output, codes_name(s), axis_index(a.axis, in.shape), set);
  } else if (v.inner == 1) {
    std::memcpy(out.data.data(), y.data(), n * 4);
  } else {
    from_rows(y.data(), reinterpret_cast<float*>(out.data.data()), v);
  }
  if (!a.codes) write_npy(a.output, out);
  if (!a.quiet) print_scaled_summary(s, counts, n, bits_per_element(s, v.rows(), v.len), secs, a.output, a.codes);
}

// The element quantizer of --format with --rounding, --overflow, --seed and --random-bits.
QuantSpec element_spec(const QuantizeArgs& a, const Format& f) {
  QuantSpec q;
  q.format = f;
  q.rounding = parse_rounding(a.rounding);
  q.overflow = parse_overflow(a.overflow);
  q.seed = a.seed;
  if (a.random_bits < 1 || a.random_bits > 32) throw Error("--random-bits must be in 1..32");
  q.random_bits = static_cast<std::uint8_t>(a.random_bits);
  validate(q);
  return q;
}

// An array of `dtype` with the shape and memory order of `in`, its bytes zero.
NpyArray array_like(const NpyArray& in, DType dtype) {
  return {dtype, in.shape, in.fortran_order, std::vector<std::uint8_t>(in.size() * itemsize(dtype))};
}

// --decode: the codes of q.format in `in` as float32.
NpyArray decode_codes(const QuantizeArgs& a, const QuantSpec& q, const NpyArray& in) {
  const std::size_t n = in.size();
  const DType want = q.format.width() <= 8 ? DType::u8 : DType::u16;
  if (in.dtype != want)
    throw Error(a.input + ": --decode of " + to_string(q.format) + " codes needs dtype " + npy_descr(want) +
                ", the file has " + npy_descr(in.dtype));
  NpyArray out = array_like(in, DType::f32);
  float* y = reinterpret_cast<float*>(out.data.data());
  if (want == DType::u8) {
    check_codes(in.data.data(), n, q.format, a.input);
    kernels::decode(in.data.data(), y, n, q.format);
  } else {
    const auto* c = reinterpret_cast<const std::uint16_t*>(in.data.data());
    check_codes(c, n, q.format, a.input);
    kernels::decode(c, y, n, q.format);
  }
  return out;
}

// The float32 values of `in` fake-quantized (float32), or their codes with --codes.
NpyArray quantize_values(const QuantizeArgs& a, const QuantSpec& q, const NpyArray& in, QuantCounts& counts) {
  if (in.dtype != DType::f32)
    throw Error(a.input + ": dtype " + npy_descr(in.dtype) +
                " is not float32 ('<f4'); convert it first, or use --decode for codes");
  const std::size_t n = in.size();
  const float* x = reinterpret_cast<const float*>(in.data.data());
  NpyArray out = array_like(in, !a.codes ? DType::f32 : q.format.width() <= 8 ? DType::u8 : DType::u16);
  if (out.dtype == DType::f32)
    kernels::quantize(x, reinterpret_cast<float*>(out.data.data()), n, q, 0, &counts);
  else if (out.dtype == DType::u8)
    kernels::encode(x, out.data.data(), n, q, 0, &counts);
  else
    kernels::encode(x, reinterpret_cast<std::uint16_t*>(out.data.data()), n, q, 0, &counts);
  return out;
}

void print_summary(const QuantizeArgs& a, const QuantSpec& q, std::size_t n, const QuantCounts& counts, double secs) {
  if (a.decode) {
    std::fprintf(stderr, "decoded %zu %s codes in %.3f s -> %s\n", n, to_string(q.format).c_str(), secs,
                 a.output.c_str());
    return;
  }
  std::fprintf(stderr,
               "%s %zu values to %s (%s, %s): overflow %llu, flushed to zero %llu, NaN %llu; "
               "%.3f s -> %s\n",
               a.codes ? "encoded" : "quantized", n, to_string(q.format).c_str(),
               std::string(to_string(q.rounding)).c_str(), std::string(to_string(q.overflow)).c_str(),
               static_cast<unsigned long long>(counts.overflow), static_cast<unsigned long long>(counts.underflow),
               static_cast<unsigned long long>(counts.nan), secs, a.output.c_str());
}

void run_quantize(const QuantizeArgs& a) {
  ScaledSpec scaled = parse_scaled(a.format);
  const QuantSpec q = element_spec(a, scaled.element.format);
  if (a.codes && a.decode) throw Error("--codes and --decode exclude each other");
  if (a.threads < 0 || a.threads > kMaxThreads)
    throw Error("--threads must be in 0.." + std::to_string(kMaxThreads) + " (0: all cores)");
  check_outputs_differ({a.output}, {a.input});
  if (scaled.scaled()) {
    scaled.element = q;
    validate(scaled);
    if (a.threads > 0) kernels::set_num_threads(a.threads);
    return run_scaled_quantize(a, scaled);
  }
  if (a.axis != -1) throw Error("--axis applies to scaled formats only (" + a.format + " has a fixed bias)");
  if (a.codes || a.decode) require_codable(q.format);
  if (a.threads > 0) kernels::set_num_threads(a.threads);
  const NpyArray in = read_npy(a.input);
  QuantCounts counts;
  const auto t0 = std::chrono::steady_clock::now();
  const NpyArray out = a.decode ? decode_codes(a, q, in) : quantize_values(a, q, in, counts);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  write_npy(a.output, out);
  if (!a.quiet) print_summary(a, q, in.size(), counts, secs);
}
}  // namespace

void register_quantize(CLI::App& app) {
  auto args = std::make_shared<QuantizeArgs>();
  auto* cmd = app.add_subcommand(
      "quantize", "Quantize a float32 .npy array (fake-quantized float32, or raw codes)");
  cmd->add_option("input", args->input, "Input .npy (float32; codes with --decode)")->required();
  cmd->add_option("output", args->output, "Output .npy (written atomically)")->required();
  cmd->add_option("-f,--format", args->format,
                  "Format, e.g. 1.4.3:10 or e4m3fn, or a scaled format, e.g. mxfp4, nvfp4, e4m3fn@1x64:e8m0:ceil")
      ->required();
  cmd->add_option("--axis", args->axis, "Scaled formats: the axis the groups run along")->capture_default_str();
  cmd->add_option("-r,--rounding", args->rounding, "nearest-even, toward-zero or stochastic")
      ->capture_default_str();
  cmd->add_option("-o,--overflow", args->overflow, "saturate, nan or inf")->capture_default_str();
  cmd->add_option("--seed", args->seed, "Stochastic rounding seed")->capture_default_str();
  cmd->add_option("--random-bits", args->random_bits, "Random bits for stochastic rounding (1-32)")
      ->capture_default_str();
  cmd->add_flag("--codes", args->codes,
                "Write the codes (uint8, or uint16 above 8 bits); scaled formats also write OUTPUT.scales.npy "
                "(and OUTPUT.tensor_scale.npy)");
  cmd->add_flag("--decode", args->decode, "Input holds codes: write their float32 values");
  cmd->add_option("--threads", args->threads, "Threads (0: all cores)")->capture_default_str();
  cmd->add_flag("-q,--quiet", args->quiet, "No summary on stderr");
  cmd->callback([args] { run_quantize(*args); });
}

}  // namespace fp8lab::cli
