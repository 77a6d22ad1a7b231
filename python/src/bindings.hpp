// The extension module fp8lab._core: each layer of the C++ library bound in its own file.
// Functions that run kernels release the GIL; C++ errors (fp8lab::Error) reach Python as
// ValueError with the C++ message, and a tensor of the wrong dtype as TypeError.
#pragma once

#include <torch/extension.h>

#include <string>

#include "fp8lab/core/codec.hpp"
#include "fp8lab/kernels/kernels.hpp"

namespace fp8lab::python {

namespace py = pybind11;

void bind_core(py::module_& m);
void bind_nn(py::module_& m);
void bind_results(py::module_& m);
void bind_data(py::module_& m);

// Throws TypeError unless t is a float32 CPU tensor (`what` names the argument).
void require_float32(const torch::Tensor& t, const char* what);

// A table of presets as rows {"name": ..., key: value(item), "note": ...}.
template <class Range, class Value>
py::list preset_rows(const Range& items, const char* key, Value value) {
  py::list l;
  for (const auto& p : items) {
    py::dict d;
    d["name"] = std::string(p.name);
    d[key] = value(p);
    d["note"] = std::string(p.note);
    l.append(d);
  }
  return l;
}

// {"total", "overflow", "underflow", "nan"}
py::dict counts_dict(const QuantCounts& c);
// {"lo": e, "counts": [n(e), n(e + 1), ...], "zero", "inf", "nan"}: counts of floor(log2|x|)
// from the lowest to the highest exponent present (the results store's form).
py::dict histogram_dict(const kernels::ExpHistogram& h);

}  // namespace fp8lab::python
