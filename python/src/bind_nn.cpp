// fp8lab._core, nn: recipes, the quantization context and per-layer state, the quantized
// ops as autograd functions (the C++ library's own: tensors cross from Python without
// copies and the backward runs in libtorch's engine), and the loss scaler.
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "fp8lab/core/error.hpp"
#include "fp8lab/train/stat_rows.hpp"
#include "fp8lab/settings/compute_spec.hpp"
#include "fp8lab/nn/loss_scale.hpp"
#include "fp8lab/nn/ops.hpp"
#include "fp8lab/settings/recipe.hpp"

namespace fp8lab::python {

namespace {

using nn::LayerState;
using nn::LayerStatePtr;
using nn::QuantContext;
using nn::TensorKind;

// {"a": "1.4.3", "w": ..., "gx": ..., "gw": ...} with "fp32" for a float32 kind.
py::dict layer_quant_dict(const nn::LayerQuant& q) {
  py::dict d;
  for (TensorKind k : nn::kAllKinds) d[py::str(std::string(nn::to_string(k)))] = nn::to_string(q[k]);
  return d;
}


namespace {

// A Python value of a recipe field as the text the recipe grammar reads (True -> "true").
std::string field_text(const std::string& key, const py::handle& v) {
  if (py::isinstance<py::bool_>(v)) return py::cast<bool>(v) ? "true" : "false";
  if (py::isinstance<py::int_>(v)) return std::to_string(py::cast<long long>(v));
  if (py::isinstance<py::str>(v)) return py::cast<std::string>(v);
  throw py::type_error("Recipe: " + key + " must be a str, bool or int, not " +
                       std::string(py::str(py::type::handle_of(v).attr("__name__"))));
}

using OverrideFields = std::vector<std::pair<std::string, std::vector<std::pair<std::string, std::string>>>>;

OverrideFields override_fields(const py::handle& list) {
  if (!py::isinstance<py::list>(list) && !py::isinstance<py::tuple>(list))
    throw py::type_error("Recipe: overrides must be a list of dicts such as {'match': 'fc*', 'gw': 'fp32'}");
  OverrideFields out;
  for (const py::handle o : list) {
    if (!py::isinstance<py::dict>(o)) throw py::type_error("Recipe: each override must be a dict with 'match'");
    std::string match;
    std::vector<std::pair<std::string, std::string>> kinds;
    for (auto item : py::reinterpret_borrow<py::dict>(o)) {
      const std::string k = py::cast<std::string>(py::str(item.first));
      if (k == "match") match = field_text(k, item.second);
      else kinds.emplace_back(k, field_text(k, item.second));
    }
    out.emplace_back(match, kinds);
  }
  return out;
}

nn::Recipe recipe_from_python(const py::object& text, const py::kwargs& fields) {
  if (!text.is_none()) {
    if (!fields.empty()) throw Error("Recipe: give a text or fields, not both");
    if (!py::isinstance<py::str>(text)) throw py::type_error("Recipe: text must be a str");
    return nn::load_recipe(py::cast<std::string>(text));
  }
  if (fields.empty()) throw Error("Recipe: give a text (a preset, a line or a .toml file) or fields (a=..., gx=...)");
  std::vector<std::pair<std::string, std::string>> values;
  OverrideFields overrides;
  for (auto item : fields) {
    const std::string key = py::cast<std::string>(item.first);
    if (key == "overrides") overrides = override_fields(item.second);
    else values.emplace_back(key, field_text(key, item.second));
  }
  return nn::recipe_from_fields(values, overrides);
}

void bind_layer_quant(py::module_& m) {
  py::class_<nn::LayerQuant>(m, "LayerQuant", "The quantizers of one layer: a, w, gx, gw (None: float32)")
      .def("__getitem__", [](const nn::LayerQuant& q, const std::string& kind) {
        return nn::to_string(q[nn::parse_kind(kind)]);
      })
      .def("as_dict", &layer_quant_dict)
      .def_property_readonly("hadamard", [](const nn::LayerQuant& q) { return q.hadamard; })
      .def_property_readonly("hadamard_signs", [](const nn::LayerQuant& q) { return std::string(nn::to_string(q.hadamard_signs)); },
                             "The Hadamard transform's signs: random, none (the plain transform) or te")
      .def_property_readonly("hadamard_on", [](const nn::LayerQuant& q) { return std::string(nn::to_string(q.hadamard_on)); },
                             "The products the Hadamard transform goes on: grad_w or backward (grad_x's too)")
      .def_property_readonly("a_bwd", [](const nn::LayerQuant& q) { return nn::to_string(q.a_bwd); },
                             "The backward product's quantizer of a ('fp32' where it is a's own, docs/spec.md §6.12)")
      .def_property_readonly("w_bwd", [](const nn::LayerQuant& q) { return nn::to_string(q.w_bwd); },
                             "The backward product's quantizer of w ('fp32' where it is w's own, docs/spec.md §6.12)")
      .def_property_readonly("bwd_from", [](const nn::LayerQuant& q) { return std::string(nn::to_string(q.bwd_from)); },
                             "What a_bwd and w_bwd quantize: tensor (the float32 tensor) or forward (the forward's values)")
      .def("__eq__", [](const nn::LayerQuant& a, const nn::LayerQuant& b) { return a == b; })
      .def(py::pickle(
          [](const nn::LayerQuant& q) {
            std::vector<std::string> kinds;
            for (TensorKind k : nn::kAllKinds) kinds.push_back(nn::to_string(q[k]));
            return py::make_tuple(kinds, q.hadamard, std::string(nn::to_string(q.hadamard_signs)),
                                  std::string(nn::to_string(q.hadamard_on)), nn::to_string(q.a_bwd),
                                  nn::to_string(q.w_bwd), std::string(nn::to_string(q.bwd_from)));
          },
          [](const py::tuple& t) {
            if (t.size() != 7) throw Error("LayerQuant: bad pickled state");
            const auto kinds = t[0].cast<std::vector<std::string>>();
            if (kinds.size() != nn::kKinds) throw Error("LayerQuant: bad pickled state");
            nn::LayerQuant q;
            for (int k = 0; k < nn::kKinds; ++k) q.q[static_cast<std::size_t>(k)] = nn::parse_kind_quant(kinds[static_cast<std::size_t>(k)]);
            q.hadamard = t[1].cast<int>();
            q.hadamard_signs = nn::parse_hadamard_signs(t[2].cast<std::string>());
            q.hadamard_on = nn::parse_hadamard_products(t[3].cast<std::string>());
            q.a_bwd = nn::parse_kind_quant(t[4].cast<std::string>());
            q.w_bwd = nn::parse_kind_quant(t[5].cast<std::string>());
            q.bwd_from = nn::parse_backward_source(t[6].cast<std::string>());
            return q;
          }))
      .def("__repr__", [](const nn::LayerQuant& q) {
        std::string s;
        for (TensorKind k : nn::kAllKinds)
          s += (s.empty() ? "" : ", ") + std::string(nn::to_string(k)) + "=" + nn::to_string(q[k]);
        if (q.a_bwd) s += ", a_bwd=" + nn::to_string(q.a_bwd);
        if (q.w_bwd) s += ", w_bwd=" + nn::to_string(q.w_bwd);
        return "LayerQuant(" + s + ")";
      });
  m.def("layer_quant", [](const py::dict& kinds) {
        nn::LayerQuant q;
        for (auto item : kinds)
          q[nn::parse_kind(py::cast<std::string>(item.first))] = nn::parse_kind_quant(py::cast<std::string>(item.second));
        return q;
      },
      py::arg("kinds"), "A LayerQuant from {'a': '1.4.3', 'gx': '1.5.2/stochastic', ...}");
}

}  // namespace

void bind_recipe(py::module_& m) {
  bind_layer_quant(m);
  py::class_<nn::Recipe>(m, "Recipe", "Quantizers for the four tensor kinds of every layer, with per-layer overrides")
      .def(py::init(&recipe_from_python), py::arg("text") = py::none(),
           "Recipe(text): a preset name (fp32, resnet32-152, mxfp8, ...), a line 'a=1.4.3,w=1.4.3,gx=1.5.2' or a "
           ".toml file. Recipe(a=..., w=..., gx=..., gw=..., exempt_first=..., keep_first=..., keep_last=..., "
           "hadamard=..., hadamard_signs=..., hadamard_on=..., a_bwd=..., w_bwd=..., bwd_from=..., "
           "compute=..., accumulate=..., name=..., overrides=[{'match': 'fc*', 'gw': 'fp32'}, ...]): the same "
           "keys as fields (docs/spec.md §4.2)")
      .def_readonly("name", &nn::Recipe::name)
      .def_property_readonly("base", [](const nn::Recipe& r) { return r.base; })
      .def_readonly("exempt_first", &nn::Recipe::exempt_first)
      .def_property_readonly("first_quant", [](const nn::Recipe& r) { return nn::to_string(r.first_quant); },
                             "The quantizer of the exempted first layer's input and output gradient ('fp32' by default)")
      .def_readonly("keep_last", &nn::Recipe::keep_last)
      .def_readonly("keep_first", &nn::Recipe::keep_first)
      .def_property_readonly("keep_first_quant", [](const nn::Recipe& r) { return nn::to_string(r.keep_first_quant); },
                             "The quantizer of the whole first layer where keep_first ('fp32' by default)")
      .def_property_readonly("keep_last_quant", [](const nn::Recipe& r) { return nn::to_string(r.keep_last_quant); },
                             "The quantizer of the whole last layer where keep_last ('fp32' by default)")
      .def_property_readonly("hadamard_signs", [](const nn::Recipe& r) { return std::string(nn::to_string(r.hadamard_signs)); })
      .def_property_readonly("hadamard_on", [](const nn::Recipe& r) { return std::string(nn::to_string(r.hadamard_on)); },
                             "The products the Hadamard transform goes on: grad_w or backward (grad_x's too)")
      .def_property_readonly("compute", [](const nn::Recipe& r) -> std::optional<std::string> {
             if (!r.compute) return std::nullopt;
             return std::string(nn::to_string(*r.compute));
           }, "The recipe's compute path (fp32, bf16, auto), or None where it leaves it to the run")
      .def_property_readonly("accumulate", [](const nn::Recipe& r) -> std::optional<std::string> {
             if (!r.accumulate) return std::nullopt;
             return nn::to_string(*r.accumulate);
           }, "The recipe's accumulation (fp32, FORMAT@CHUNK or a dot model, docs/spec.md §7.4), or None where it leaves it to the run")
      .def("resolve",
           [](const nn::Recipe& r, const std::string& path, int index, int count) {
             if (count < 1 || index < 0 || index >= count)
               throw Error("Recipe.resolve: layer index " + std::to_string(index) + " of " + std::to_string(count) +
                           " layers: the index must be in 0..count-1");
             return r.resolve(path, index, count);
           },
           py::arg("path"), py::arg("index"), py::arg("count"),
           "The quantizers of layer `index` of `count` at module path `path`")
      .def_property_readonly("depends_on_count", &nn::Recipe::depends_on_count,
                             "Whether a layer's quantizers depend on how many layers there are (keep_last, an override of 'last')")
      .def("check_overrides", [](const nn::Recipe& r, const std::vector<std::string>& paths) {
             nn::check_overrides(r, paths);
           },
           py::arg("paths"), "Raises ValueError naming every override that matches none of the paths")
      .def("to_line", &nn::Recipe::to_line, "The one-line form (raises ValueError for a recipe with overrides)")
      .def("to_toml", &nn::Recipe::to_toml, "The TOML form: every key and override")
      .def_property_readonly("hadamard", [](const nn::Recipe& r) { return r.hadamard; })
      .def("__eq__", [](const nn::Recipe& a, const nn::Recipe& b) { return a == b; }, py::is_operator())
      .def("__repr__", [](const nn::Recipe& r) {
        if (!r.name.empty()) return "Recipe('" + r.name + "')";
        return r.overrides.empty() ? "Recipe('" + r.to_line() + "')" : "Recipe(<" + std::to_string(r.overrides.size()) + " overrides>)";
      });
  m.def("recipe_presets", [] {
    return preset_rows(nn::recipe_presets(), "recipe", [](const nn::RecipePreset& p) { return std::string(p.line); });
  });
}

void bind_context(py::module_& m) {
  py::class_<QuantContext, std::shared_ptr<QuantContext>>(m, "QuantContext",
                                                         "Shared by every quantized layer of a model")
      .def(py::init([](std::uint64_t seed, const std::string& compute, const std::string& accumulate,
                       int stats_interval, bool save_codes) {
             auto c = std::make_shared<QuantContext>();
             c->seed = seed;
             c->compute = nn::parse_compute(compute);
             c->accumulate = nn::parse_accumulation(accumulate);
             if (stats_interval < 0) throw Error("stats_interval must be >= 0");
             c->stats_interval = stats_interval;
             c->save_codes = save_codes;
             return c;
           }),
           py::kw_only(), py::arg("seed") = 0, py::arg("compute") = "fp32", py::arg("accumulate") = "fp32",
           py::arg("stats_interval") = 0, py::arg("save_codes") = true)
      .def_property_readonly("seed", [](const QuantContext& c) { return c.seed; })
      .def_property("step", [](const QuantContext& c) { return c.step.load(); },
                    [](QuantContext& c, std::uint64_t s) { c.step = s; })
      .def_property("shard", [](const QuantContext& c) { return c.micro.load(); },
                    [](QuantContext& c, std::uint32_t m) { c.micro = m; },
                    "The shard of the step's batch being computed (0: the whole batch): each shard draws its own "
                    "stochastic-rounding streams, so a shard quantizes alike on whichever process computes it")
      .def_readwrite("recording", &QuantContext::recording)
      .def_readwrite("stats_interval", &QuantContext::stats_interval)
      .def_property_readonly("compute", [](const QuantContext& c) { return std::string(nn::to_string(c.compute)); })
      .def_property_readonly("accumulate", [](const QuantContext& c) { return nn::to_string(c.accumulate); })
      .def_property_readonly("saved_bytes", [](const QuantContext& c) { return c.saved_bytes.load(); })
      .def_property_readonly("in_place", [](const QuantContext& c) { return c.in_place.load(); },
                             "Gradients quantized in their own memory so far")
      // Pickled (and deep-copied) as its settings and step; statistics not yet taken stay behind.
      .def(py::pickle(
          [](const QuantContext& c) {
            return py::make_tuple(c.seed, std::string(nn::to_string(c.compute)), nn::to_string(c.accumulate),
                                  c.stats_interval, c.save_codes, c.save_weight_codes, c.step.load(), c.recording);
          },
          [](const py::tuple& t) {
            if (t.size() != 8) throw Error("QuantContext: bad pickled state");
            auto c = std::make_shared<QuantContext>();
            c->seed = t[0].cast<std::uint64_t>();
            c->compute = nn::parse_compute(t[1].cast<std::string>());
            c->accumulate = nn::parse_accumulation(t[2].cast<std::string>());
            c->stats_interval = t[3].cast<int>();
            c->save_codes = t[4].cast<bool>();
            c->save_weight_codes = t[5].cast<bool>();
            c->step = t[6].cast<std::uint64_t>();
            c->recording = t[7].cast<bool>();
            return c;
          }))
      .def("take_stat_rows", [](QuantContext& c) { return train::stat_rows(c.stats->take()); },
           "The statistics records since the last call, as the results store's rows (and clears them)");
}

void bind_layer_state(py::module_& m) {
  py::class_<LayerState, LayerStatePtr>(m, "LayerState", "One quantized layer: its quantizers, streams and counts")
      .def(py::init([](const std::string& name, const nn::LayerQuant& q, std::shared_ptr<QuantContext> ctx, int index) {
             if (!ctx) throw Error("a layer needs a QuantContext");
             return nn::make_layer_state(name, q, std::move(ctx), index);
           }),
           py::arg("name"), py::arg("quant"), py::arg("context"), py::arg("index") = 0)
      .def_readonly("name", &LayerState::name)
      .def_readonly("index", &LayerState::index)
      .def_property_readonly("quant", [](const LayerState& s) { return s.quant; })
      .def_property_readonly("context", [](const LayerState& s) { return s.ctx; })
      .def("counts", [](const LayerState& s) {
        py::dict d;
        const auto c = s.stats.counts();
        for (TensorKind k : nn::kAllKinds) d[py::str(std::string(nn::to_string(k)))] = counts_dict(c[static_cast<int>(k)]);
        return d;
      })
      .def("reset_counts", [](LayerState& s) { s.stats.reset_counts(); })
      .def("products", [](const LayerState& s) {
             const auto [f, b] = s.products.counts();
             py::dict d;
             d["fp32"] = f;
             d["bf16"] = b;
             return d;
           },
           "Products run so far on each compute path")
      .def("seed_for", [](const LayerState& s, const std::string& kind, std::uint32_t call, std::uint32_t operand) {
             return s.streams.seed_for(nn::parse_kind(kind), call, operand);
           },
           py::arg("kind"), py::arg("call"), py::arg("operand") = 0,
           "The stochastic-rounding stream of one tensor in the current step")
      // Pickled (and deep-copied) as its name, quantizers, context and position; its counts start
      // again from zero, and delayed scaling's amax histories are not carried.
      .def(py::pickle(
          [](const LayerState& s) { return py::make_tuple(s.name, s.quant, s.ctx, s.index); },
          [](const py::tuple& t) {
            if (t.size() != 4) throw Error("LayerState: bad pickled state");
            return nn::make_layer_state(t[0].cast<std::string>(), t[1].cast<nn::LayerQuant>(),
                                        t[2].cast<std::shared_ptr<QuantContext>>(), t[3].cast<int>());
          }))
      .def("__repr__", [](const LayerState& s) { return "LayerState('" + s.name + "')"; });
}

// The products split into a forward and a backward call (nn::quant_*_forward,
// quant_backward): torch.compile's custom ops (fp8lab/torch/_compiled.py).
void bind_split_ops(py::module_& m) {
  const auto pair = [](nn::SplitForward r) { return std::make_pair(std::move(r.y), std::move(r.handle)); };
  m.def("quant_linear_forward",
        [pair](const torch::Tensor& x, const torch::Tensor& w, const std::optional<torch::Tensor>& b,
               const LayerStatePtr& st) {
          require_float32(x, "linear input");
          require_float32(w, "linear weight");
          py::gil_scoped_release nogil;
          return pair(nn::quant_linear_forward(x, w, b ? *b : torch::Tensor(), st));
        },
        py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("layer"));
  m.def("quant_conv2d_forward",
        [pair](const torch::Tensor& x, const torch::Tensor& w, const std::optional<torch::Tensor>& b,
               std::vector<std::int64_t> stride, std::vector<std::int64_t> padding, std::vector<std::int64_t> dilation,
               std::int64_t groups, const LayerStatePtr& st) {
          require_float32(x, "conv2d input");
          require_float32(w, "conv2d weight");
          py::gil_scoped_release nogil;
          return pair(nn::quant_conv2d_forward(x, w, b ? *b : torch::Tensor(), std::move(stride), std::move(padding),
                                               std::move(dilation), groups, st));
        },
        py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("stride"), py::arg("padding"), py::arg("dilation"),
        py::arg("groups"), py::arg("layer"));
  m.def("quant_conv_forward",
        [pair](const torch::Tensor& x, const torch::Tensor& w, const std::optional<torch::Tensor>& b,
               std::vector<std::int64_t> stride, std::vector<std::int64_t> padding, std::vector<std::int64_t> dilation,
               bool transposed, std::vector<std::int64_t> output_padding, std::int64_t groups, const LayerStatePtr& st) {
          require_float32(x, "conv input");
          require_float32(w, "conv weight");
          py::gil_scoped_release nogil;
          return pair(nn::quant_conv_forward(x, w, b ? *b : torch::Tensor(), std::move(stride), std::move(padding),
                                             std::move(dilation), transposed, std::move(output_padding), groups, st));
        },
        py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("stride"), py::arg("padding"), py::arg("dilation"),
        py::arg("transposed"), py::arg("output_padding"), py::arg("groups"), py::arg("layer"));
  m.def("quant_matmul_forward",
        [pair](const torch::Tensor& a, const torch::Tensor& b, const LayerStatePtr& st) {
          require_float32(a, "matmul a");
          require_float32(b, "matmul b");
          py::gil_scoped_release nogil;
          return pair(nn::quant_matmul_forward(a, b, st));
        },
        py::arg("a"), py::arg("b"), py::arg("layer"));
  m.def("quant_backward",
        [](const torch::Tensor& g, const torch::Tensor& handle, const std::vector<bool>& needs) {
          py::gil_scoped_release nogil;
          return nn::quant_backward(g, handle, needs);
        },
        py::arg("grad"), py::arg("handle"), py::arg("needs"),
        "The gradients of a split forward's tensor inputs (None where needs says no)");
}

void bind_ops(py::module_& m) {
  m.def("quant_linear",
        [](const torch::Tensor& x, const torch::Tensor& w, const std::optional<torch::Tensor>& b, const LayerStatePtr& st) {
          require_float32(x, "linear input");
          require_float32(w, "linear weight");
          py::gil_scoped_release nogil;
          return nn::quant_linear(x, w, b ? *b : torch::Tensor(), st);
        },
        py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("layer"));
  m.def("quant_conv2d",
        [](const torch::Tensor& x, const torch::Tensor& w, const std::optional<torch::Tensor>& b,
           std::vector<std::int64_t> stride, std::vector<std::int64_t> padding, std::vector<std::int64_t> dilation,
           std::int64_t groups, const LayerStatePtr& st) {
          require_float32(x, "conv2d input");
          require_float32(w, "conv2d weight");
          if (x.dim() != 4) throw Error("conv2d: expected an NCHW input, got " + std::to_string(x.dim()) + " dimensions");
          py::gil_scoped_release nogil;
          return nn::quant_conv2d(x, w, b ? *b : torch::Tensor(), std::move(stride), std::move(padding),
                                  std::move(dilation), groups, st);
        },
        py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("stride"), py::arg("padding"), py::arg("dilation"),
        py::arg("groups"), py::arg("layer"));
  m.def("quant_conv",
        [](const torch::Tensor& x, const torch::Tensor& w, const std::optional<torch::Tensor>& b,
           std::vector<std::int64_t> stride, std::vector<std::int64_t> padding, std::vector<std::int64_t> dilation,
           bool transposed, std::vector<std::int64_t> output_padding, std::int64_t groups, const LayerStatePtr& st) {
          require_float32(x, "conv input");
          require_float32(w, "conv weight");
          py::gil_scoped_release nogil;
          return nn::quant_conv(x, w, b ? *b : torch::Tensor(), std::move(stride), std::move(padding),
                                std::move(dilation), transposed, std::move(output_padding), groups, st);
        },
        py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("stride"), py::arg("padding"), py::arg("dilation"),
        py::arg("transposed"), py::arg("output_padding"), py::arg("groups"), py::arg("layer"));
  m.def("quant_matmul",
        [](const torch::Tensor& a, const torch::Tensor& b, const LayerStatePtr& st) {
          require_float32(a, "matmul a");
          require_float32(b, "matmul b");
          py::gil_scoped_release nogil;
          return nn::quant_matmul(a, b, st);
        },
        py::arg("a"), py::arg("b"), py::arg("layer"));
  bind_split_ops(m);
}

void bind_loss_scale(py::module_& m) {
  py::class_<nn::LossScaler>(m, "LossScalerCore", "Loss scaling (static, Backoff, LogMax) as the C++ trainer runs it")
      .def(py::init([](const std::string& text, std::optional<nn::Recipe> recipe) {
             nn::LossScaleConfig c = nn::parse_loss_scale(text);
             if (recipe) c = nn::with_recipe_target(c, *recipe);
             return nn::LossScaler(c);
           }),
           py::arg("text"), py::arg("recipe") = py::none())
      .def("scale", &nn::LossScaler::scale)
      .def("log2_scale", &nn::LossScaler::log2_scale)
      .def("update",
           [](nn::LossScaler& s, const std::vector<torch::Tensor>& grads) {
             nn::LossScaleStep r;
             {
               py::gil_scoped_release nogil;
               r = s.update(grads);
             }
             py::dict d;
             d["scale"] = r.scale;
             d["overflow"] = r.overflow;
             d["skipped"] = r.skipped;
             d["log2_max_grad"] = r.log2_max_grad;
             return d;
           },
           py::arg("grads"), "Unscales the gradients in place and decides the step and the next scale")
      .def("skipped_steps", &nn::LossScaler::skipped_steps)
      .def("steps", &nn::LossScaler::steps)
      .def("state", &nn::LossScaler::state)
      .def("set_state", &nn::LossScaler::set_state)
      .def("describe", [](const nn::LossScaler& s) { return nn::to_string(s.config()); })
      .def_property_readonly("method", [](const nn::LossScaler& s) { return std::string(nn::to_string(s.config().method)); })
      .def_property_readonly("target_max", [](const nn::LossScaler& s) { return s.config().grad_format_max; });
  m.def("backoff_blind_to_overflow",
        [](const std::string& text, const nn::Recipe& r) {
          return nn::backoff_blind_to_overflow(nn::parse_loss_scale(text), r);
        },
        py::arg("text"), py::arg("recipe"));
}

}  // namespace

void bind_nn(py::module_& m) {
  bind_recipe(m);
  bind_context(m);
  bind_layer_state(m);
  bind_ops(m);
  bind_loss_scale(m);
}

}  // namespace fp8lab::python
