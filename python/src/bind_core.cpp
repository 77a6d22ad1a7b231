// fp8lab._core, core and kernels: formats, scaled formats, quantize/encode/decode of float32
// CPU tensors (NumPy arrays cross as tensors sharing their memory: fp8lab/__init__.py), and
// the analysis functions.
#include <pybind11/stl.h>

#include <cstring>
#include <optional>

#include "bindings.hpp"
#include "fp8lab/core/analysis.hpp"
#include "fp8lab/core/codec.hpp"
#include "fp8lab/core/format.hpp"
#include "fp8lab/core/scaled.hpp"
#include "fp8lab/kernels/kernels.hpp"
#include "fp8lab/nn/tensor_quant.hpp"

namespace fp8lab::python {

namespace {

// Checked before it narrows to QuantSpec's byte, where 257 would pass as 1.
std::uint8_t random_bits_of(int random_bits) {
  if (random_bits < 1 || random_bits > 32)
    throw Error("random_bits must be 1..32 (got " + std::to_string(random_bits) + ")");
  return static_cast<std::uint8_t>(random_bits);
}

QuantSpec make_spec(const Format& f, const std::string& rounding, const std::string& overflow, int random_bits,
                    std::uint64_t seed) {
  QuantSpec q;
  q.format = f;
  q.rounding = parse_rounding(rounding);
  q.overflow = parse_overflow(overflow);
  q.random_bits = random_bits_of(random_bits);
  q.seed = seed;
  validate(q);
  return q;
}

py::dict scaled_counts_dict(const ScaledCounts& c) {
  py::dict d = counts_dict(c.elements);
  d["groups"] = c.groups;
  d["saturated_groups"] = c.saturated_groups;
  d["nan_groups"] = c.nan_groups;
  d["zero_groups"] = c.zero_groups;
  d["scale_underflow"] = c.scale_underflow;
  d["scale_overflow"] = c.scale_overflow;
  return d;
}

// One row of Table 1 (the columns of `fp8lab formats`).
py::dict format_row(const std::string& name, const Format& f) {
  py::dict r;
  r["name"] = name;
  r["format"] = to_string(f);
  r["E"] = static_cast<int>(f.exp_bits);
  r["M"] = static_cast<int>(f.man_bits);
  r["bias"] = static_cast<int>(f.bias);
  r["policy"] = std::string(to_string(f.policy));
  r["subnormals"] = f.subnormals;
  r["max"] = f.max_finite();
  r["min_normal"] = f.min_normal();
  r["min_positive"] = f.min_positive();
  r["dynamic_range_db"] = dynamic_range_db(f);
  r["snr_db"] = float_snr_model_db(f);
  return r;
}

void bind_format(py::module_& m) {
  py::class_<Format>(m, "Format", "A 1.E.M floating-point format with its bias and special-value policy")
      .def(py::init([](const std::string& text) { return parse_format(text); }), py::arg("text"),
           "Parses '1.4.3', '1.4.3:10', '1.5.2:16:fn', '0.8.0:fn:nosub:nozero' or a preset name (e4m3fn, ...)")
      .def(py::init([](int exp_bits, int man_bits, std::optional<int> bias, const std::string& policy,
                       bool subnormals) {
             return make_format(exp_bits, man_bits, bias ? *bias : natural_bias(exp_bits), parse_policy(policy),
                                subnormals);
           }),
           py::kw_only(), py::arg("exp_bits"), py::arg("man_bits"), py::arg("bias") = py::none(),
           py::arg("policy") = "fnuz", py::arg("subnormals") = true)
      .def_property_readonly("exp_bits", [](const Format& f) { return static_cast<int>(f.exp_bits); })
      .def_property_readonly("man_bits", [](const Format& f) { return static_cast<int>(f.man_bits); })
      .def_property_readonly("bias", [](const Format& f) { return static_cast<int>(f.bias); })
      .def_property_readonly("policy", [](const Format& f) { return std::string(to_string(f.policy)); })
      .def_property_readonly("subnormals", [](const Format& f) { return f.subnormals; })
      .def_property_readonly("signed", [](const Format& f) { return f.sign; })
      .def_property_readonly("zero", [](const Format& f) { return f.zero; },
                             "False where code 0 is 2^-bias, not zero (E8M0)")
      .def_property_readonly("bits", &Format::width, "Bits per value, the sign included")
      .def_property_readonly("max", &Format::max_finite, "Largest finite value")
      .def_property_readonly("min_normal", &Format::min_normal, "Smallest normal value (0 without an exponent)")
      .def_property_readonly("min_subnormal", &Format::min_positive,
                             "Smallest positive value (a subnormal where the format has them)")
      .def_property_readonly("dynamic_range_db", [](const Format& f) { return dynamic_range_db(f); })
      .def_property_readonly("snr_db", [](const Format& f) { return float_snr_model_db(f); },
                             "The SNR model of the paper's Appendix B, 7.44 + 6.02 (M + 1) dB")
      .def_property_readonly("name", [](const Format& f) { return to_string(f); }, "Canonical text")
      .def_property_readonly("preset", [](const Format& f) -> std::optional<std::string> {
        const auto p = preset_name(f);
        return p.empty() ? std::nullopt : std::optional<std::string>(std::string(p));
      })
      .def_property_readonly("has_nan", &Format::has_nan)
      .def_property_readonly("has_inf", &Format::has_inf)
      .def("values", [](const Format& f) {
             require_codable(f);
             const std::int64_t n = std::int64_t{1} << f.width();
             torch::Tensor y = torch::empty({n}, torch::kFloat32);
             float* p = y.data_ptr<float>();
             for (std::int64_t c = 0; c < n; ++c) p[c] = decode(static_cast<std::uint32_t>(c), f);
             return y;
           },
           "The value of every code, indexed by the code (NaN codes give NaN)")
      .def("__str__", [](const Format& f) { return to_string(f); })
      .def("__repr__", [](const Format& f) { return "Format('" + to_string(f) + "')"; })
      .def("__eq__", [](const Format& a, const Format& b) { return a == b; })
      .def("__hash__", [](const Format& f) { return py::hash(py::str(to_string(f))); })
      .def(py::pickle([](const Format& f) { return to_string(f); },
                      [](const std::string& s) { return parse_format(s); }));
  py::implicitly_convertible<py::str, Format>();
}

void bind_scaled(py::module_& m) {
  py::class_<ScaledSpec>(m, "ScaledFormat",
                         "A format with a scale per group of values (OCP MX, NVFP4, tiles, per-tensor scaling)")
      .def(py::init([](const std::string& text) { return parse_scaled(text); }), py::arg("text"),
           "Parses 'mxfp4', 'nvfp4', 'e4m3fn@1x32:e8m0:floor', 'e5m2@tensor:fp32:nearest:delayed-16', ...")
      .def_property_readonly("element", [](const ScaledSpec& s) { return s.element.format; })
      .def_property_readonly("scaled", &ScaledSpec::scaled, "False for a plain fixed-bias format")
      .def_property_readonly("granularity", [](const ScaledSpec& s) { return std::string(to_string(s.granularity)); })
      .def_property_readonly("block", [](const ScaledSpec& s) { return s.block; })
      .def_property_readonly("scale_format", [](const ScaledSpec& s) { return std::string(to_string(s.scale)); })
      .def_property_readonly("rule", [](const ScaledSpec& s) { return std::string(to_string(s.rule)); })
      .def_property_readonly("tensor_scale", [](const ScaledSpec& s) { return s.tensor_scale; })
      .def_property_readonly("tensor_scale_on_output", &ScaledSpec::tensor_scale_on_output,
                             "Whether products apply the tensor scale to their output (docs/spec.md §6.7); "
                             "False without one or where it is folded into the values (tensor-scale-folded)")
      .def_property_readonly("arithmetic", [](const ScaledSpec& s) { return std::string(to_string(s.arithmetic)); },
                             "Whose float32 operations choose scales and scale elements: exact (docs/spec.md "
                             "§6.2-6.3), torchao (its NVFP4 quantizer), te (TransformerEngine's current scaling and NVFP4 "
                             "quantizer, §6.9) or quartet (Quartet II's NVFP4 kernels, §6.13)")
      .def_property_readonly("eden", [](const ScaledSpec& s) { return s.eden; },
                             "MS-EDEN's window (option eden-N, docs/spec.md §6.13; 0: off): each window's groups share "
                             "a correction of their scales, which are then rounded stochastically")
      .def_property_readonly("dither_scale", [](const ScaledSpec& s) { return s.dither_scale; },
                             "Tseng et al.'s dither-scale (docs/spec.md §6.11): E8M0 blocks' elements rounded from "
                             "3/4 of x / 2^e, read back as q 2^(e+2) / 3")
      .def_property_readonly("four_over_six", [](const ScaledSpec& s) { return s.four_over_six; },
                             "Four Over Six (option 4over6, docs/spec.md §6.10): each group keeps the scale for 6 "
                             "or for 4, whichever gives the smaller squared error")
      .def_property_readonly("history", [](const ScaledSpec& s) { return s.history; },
                             "Delayed scaling's amax history length (0: current scaling)")
      .def_property_readonly("name", [](const ScaledSpec& s) { return to_string(s); })
      .def("bits_per_element", [](const ScaledSpec& s, std::size_t rows, std::size_t cols) {
             return bits_per_element(s, rows, cols);
           },
           py::arg("rows"), py::arg("cols"), "Storage per element of a rows x cols matrix, scales included")
      .def("__str__", [](const ScaledSpec& s) { return to_string(s); })
      .def("__repr__", [](const ScaledSpec& s) { return "ScaledFormat('" + to_string(s) + "')"; })
      .def("__eq__", [](const ScaledSpec& a, const ScaledSpec& b) { return a == b; })
      .def("__hash__", [](const ScaledSpec& s) { return py::hash(py::str(to_string(s))); })
      .def(py::pickle([](const ScaledSpec& s) { return to_string(s); },
                      [](const std::string& t) { return parse_scaled(t); }));
}

// ---- tensors ------------------------------------------------------------------------------

// Q(t) as a new tensor, or written into t; the counts of what rounding did.
std::pair<torch::Tensor, QuantCounts> quantize_tensor(torch::Tensor t, const QuantSpec& q, bool inplace) {
  QuantCounts c;
  if (!inplace) return {nn::fake_quantize(t, q, q.seed, &c), c};
  const bool direct = t.is_contiguous() || (q.rounding != Rounding::stochastic && t.is_non_overlapping_and_dense());
  if (direct) {
    nn::fake_quantize_(t, q, q.seed, &c);
  } else {  // a strided view: quantized in logical order, written back through the view
    t.copy_(nn::fake_quantize(t, q, q.seed, &c));
  }
  return {t, c};
}

// quantize_tensor, encode_tensor, decode_tensor: one element format, any tensor.
void bind_element_functions(py::module_& m) {
  m.def(
      "quant_spec",
      [](const Format& f, const std::string& rounding, const std::string& overflow, int random_bits) {
        const QuantSpec q = make_spec(f, rounding, overflow, random_bits, 0);
        return py::make_tuple(std::string(to_string(q.rounding)), std::string(to_string(q.overflow)),
                              static_cast<int>(q.random_bits));
      },
      "The quantizer's rounding and overflow as canonical names, and its random bits, checked as the kernels "
      "check them (ValueError naming what is wrong)",
      py::arg("format"), py::arg("rounding"), py::arg("overflow"), py::arg("random_bits"));
  m.def(
      "quantize_tensor",
      [](torch::Tensor t, const Format& f, const std::string& rounding, const std::string& overflow, int random_bits,
         std::uint64_t seed, bool inplace) {
        require_float32(t, "quantize");
        const QuantSpec q = make_spec(f, rounding, overflow, random_bits, seed);
        py::gil_scoped_release nogil;
        auto [y, c] = quantize_tensor(std::move(t), q, inplace);
        py::gil_scoped_acquire gil;
        return py::make_tuple(y, counts_dict(c));
      },
      py::arg("t"), py::arg("format"), py::arg("rounding"), py::arg("overflow"), py::arg("random_bits"),
      py::arg("seed"), py::arg("inplace"));
  m.def(
      "encode_tensor",
      [](const torch::Tensor& t, const Format& f, const std::string& rounding, const std::string& overflow,
         int random_bits, std::uint64_t seed) {
        require_float32(t, "encode");
        const QuantSpec q = make_spec(f, rounding, overflow, random_bits, seed);
        QuantCounts c;
        torch::Tensor codes;
        {
          py::gil_scoped_release nogil;
          codes = nn::encode_tensor(t, q, q.seed, &c);
        }
        return py::make_tuple(codes, counts_dict(c));
      },
      py::arg("t"), py::arg("format"), py::arg("rounding"), py::arg("overflow"), py::arg("random_bits"),
      py::arg("seed"));
  m.def(
      "decode_tensor",
      [](const torch::Tensor& codes, const Format& f) {
        require_codable(f);
        const auto want = f.width() <= 8 ? torch::kUInt8 : torch::kInt16;
        if (codes.scalar_type() != want)
          throw py::type_error("decode: codes of " + to_string(f) + " are " + (f.width() <= 8 ? "uint8" : "uint16") +
                               ", got " + std::string(c10::toString(codes.scalar_type())));
        if (!codes.device().is_cpu()) throw py::type_error("decode: fp8lab works on CPU tensors");
        const torch::Tensor c = codes.contiguous();
        if (f.width() <= 8) check_codes(c.data_ptr<std::uint8_t>(), static_cast<std::size_t>(c.numel()), f, "decode");
        else check_codes(reinterpret_cast<const std::uint16_t*>(c.data_ptr<std::int16_t>()), static_cast<std::size_t>(c.numel()), f, "decode");
        py::gil_scoped_release nogil;
        return nn::decode_tensor(c, f);
      },
      py::arg("codes"), py::arg("format"));
}

// scaled_quantize_matrix, scaled_decode_matrix: a scaled format over a matrix's groups.
void bind_scaled_functions(py::module_& m) {
  m.def(
      "scaled_quantize_matrix",
      [](const torch::Tensor& mat, const ScaledSpec& s_in, const std::string& rounding, int random_bits,
         std::uint64_t seed, bool values, bool codes, std::optional<float> delayed_amax) {
        require_float32(mat, "quantize");
        ScaledSpec s = s_in;
        s.element.rounding = parse_rounding(rounding);
        s.element.random_bits = random_bits_of(random_bits);
        validate(s);
        if (codes && s.element.format.width() > 8)
          throw Error("codes of scaled formats take elements of at most 8 bits (" + to_string(s.element.format) + ")");
        ScaledCall call;
        call.delayed_amax = delayed_amax;
        ScaledCounts c;
        nn::ScaledTensor q;
        {
          py::gil_scoped_release nogil;
          q = nn::scaled_quantize_matrix(mat, s, seed, call, {.values = values, .codes = codes}, &c);
        }
        py::dict r;
        r["values"] = values ? py::cast(q.values) : py::none();
        r["codes"] = codes ? py::cast(q.codes) : py::none();
        const BlockLayout l = block_layout(s, static_cast<std::size_t>(mat.size(0)), static_cast<std::size_t>(mat.size(1)));
        r["scales"] = q.scales.reshape({static_cast<std::int64_t>(l.grid_rows()), static_cast<std::int64_t>(l.grid_cols())});
        r["tensor_scale"] = q.tensor_scale;
        r["amax"] = q.amax;
        r["counts"] = scaled_counts_dict(c);
        return r;
      },
      py::arg("matrix"), py::arg("format"), py::arg("rounding"), py::arg("random_bits"), py::arg("seed"),
      py::arg("values"), py::arg("codes"), py::arg("delayed_amax") = py::none());
  m.def(
      "scaled_decode_matrix",
      [](const torch::Tensor& codes, const torch::Tensor& scales, float tensor_scale, const ScaledSpec& s) {
        if (codes.scalar_type() != torch::kUInt8 || codes.dim() != 2)
          throw py::type_error("decode: codes of a scaled format are a uint8 matrix");
        if (scales.scalar_type() != torch::kInt32)
          throw py::type_error("decode: scales are int32 (the uint32 scale codes)");
        const std::size_t groups = block_layout(s, static_cast<std::size_t>(codes.size(0)),
                                                static_cast<std::size_t>(codes.size(1))).groups();
        if (static_cast<std::size_t>(scales.numel()) != groups)
          throw Error("decode: " + std::to_string(scales.numel()) + " scales given, " + to_string(s) + " has " +
                      std::to_string(groups) + " for a " + std::to_string(codes.size(0)) + "x" +
                      std::to_string(codes.size(1)) + " matrix");
        nn::ScaledTensor q;
        q.codes = codes.contiguous();
        check_codes(q.codes.data_ptr<std::uint8_t>(), static_cast<std::size_t>(q.codes.numel()), s.element.format, "decode");
        q.scales = scales.contiguous();
        check_scale_codes(reinterpret_cast<const std::uint32_t*>(q.scales.data_ptr<std::int32_t>()),
                          static_cast<std::size_t>(q.scales.numel()), s, "decode: scales");
        check_tensor_scale(tensor_scale, s, "decode");
        q.tensor_scale = tensor_scale;
        py::gil_scoped_release nogil;
        return nn::scaled_decode_matrix(q, s);
      },
      py::arg("codes"), py::arg("scales"), py::arg("tensor_scale"), py::arg("format"));
}

// ---- analysis -----------------------------------------------------------------------------

DistSpec dist_of(const std::string& dist, double scale) {
  DistSpec d = parse_dist_spec(dist);
  if (!(scale > 0)) throw Error("scale must be positive (got " + std::to_string(scale) + ")");
  d.scale = scale;
  return d;
}

std::vector<float> as_vector(const torch::Tensor& t) {
  require_float32(t, "x");
  const torch::Tensor c = t.contiguous();
  return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
}

void bind_analysis(py::module_& m) {
  m.def("dynamic_range_db", [](const Format& f) { return dynamic_range_db(f); }, py::arg("format"),
        "20 log10(max / min positive)");
  m.def("float_snr_model_db", [](const Format& f) { return float_snr_model_db(f); }, py::arg("format"),
        "Appendix B: 7.44 + 6.02 (M + 1) dB");
  m.def("snr_model_db", [](const Format& f, const std::string& dist, double scale) {
          return snr_model_db(f, dist_of(dist, scale));
        },
        py::arg("format"), py::arg("dist") = "normal", py::arg("scale") = 1.0,
        "The SNR model: Appendix A for a scaled integer (E = 0), Appendix B otherwise");
  m.def("sample", [](const std::string& dist, std::int64_t count, std::uint64_t seed, double scale) {
          if (count < 0) throw Error("sample: n must be >= 0 (got " + std::to_string(count) + ")");
          const auto n = static_cast<std::size_t>(count);
          std::vector<float> x = sample(dist_of(dist, scale), n, seed);
          torch::Tensor t = torch::empty({static_cast<std::int64_t>(n)}, torch::kFloat32);
          std::memcpy(t.data_ptr<float>(), x.data(), n * sizeof(float));
          return t;
        },
        py::arg("dist"), py::arg("n"), py::arg("seed") = 0, py::arg("scale") = 1.0,
        "Deterministic samples of normal, uniform, laplace, loguniform, student-t:DOF, normal-outliers:F:S");
  m.def("measured_snr_db", [](const torch::Tensor& x, const Format& f) {
          const std::vector<float> v = as_vector(x);
          py::gil_scoped_release nogil;
          return measured_snr_db(f, v);
        },
        py::arg("x"), py::arg("format"));
  m.def("measured_scaled_snr_db", [](const torch::Tensor& x, const ScaledSpec& s, std::size_t cols) {
          const std::vector<float> v = as_vector(x);
          if (cols == 0 || v.size() % cols) throw Error("the values are not a whole number of rows of " + std::to_string(cols));
          py::gil_scoped_release nogil;
          return measured_snr_db(s, v, cols);
        },
        py::arg("x"), py::arg("format"), py::arg("cols"));
  m.def("exponent_histogram", [](const torch::Tensor& x) {
          require_float32(x, "exponent_histogram");
          const torch::Tensor c = x.contiguous();
          kernels::ExpHistogram h;
          {
            py::gil_scoped_release nogil;
            h = kernels::exponent_histogram(c.data_ptr<float>(), static_cast<std::size_t>(c.numel()));
          }
          return histogram_dict(h);
        },
        py::arg("x"), "Counts of floor(log2|x|): {'lo': e, 'counts': [n(e), n(e+1), ...], 'zero', 'inf', 'nan'}");
}

void bind_tables(py::module_& m) {
  m.def("format_row", [](const std::string& name) { return format_row(name, parse_format(name)); }, py::arg("name"));
  m.def("table1_names", [] {
    std::vector<std::string> v;
    for (auto n : table1_format_names()) v.emplace_back(n);
    return v;
  });
  m.def("presets", [] { return preset_rows(presets(), "format", [](const Preset& p) { return to_string(p.format); }); });
  m.def("scaled_presets", [] {
    return preset_rows(scaled_presets(), "format", [](const ScaledPreset& p) { return std::string(p.spec); });
  });
  m.def("kernel_target", [] { return kernels::current_target(); }, "The SIMD target the kernels run on");
}

}  // namespace

void bind_core(py::module_& m) {
  bind_format(m);
  bind_scaled(m);
  bind_element_functions(m);
  bind_scaled_functions(m);
  bind_analysis(m);
  bind_tables(m);
}

}  // namespace fp8lab::python
