#include "bindings.hpp"

#include <pybind11/stl.h>

#include "fp8lab/core/error.hpp"

namespace fp8lab::python {

void require_float32(const torch::Tensor& t, const char* what) {
  if (t.scalar_type() != torch::kFloat32)
    throw py::type_error(std::string(what) + ": expected float32 values, got " +
                         std::string(c10::toString(t.scalar_type())));
  if (!t.device().is_cpu())
    throw py::type_error(std::string(what) + ": fp8lab works on CPU tensors, got one on " + t.device().str());
}

py::dict counts_dict(const QuantCounts& c) {
  py::dict d;
  d["total"] = c.total;
  d["overflow"] = c.overflow;
  d["underflow"] = c.underflow;
  d["nan"] = c.nan;
  return d;
}

py::dict histogram_dict(const kernels::ExpHistogram& h) {
  const kernels::ExpRange r = kernels::nonzero_range(h);
  py::dict d;
  d["lo"] = r.lo;
  d["counts"] = r.counts;
  d["zero"] = h.zero;
  d["inf"] = h.inf;
  d["nan"] = h.nan;
  return d;
}

}  // namespace fp8lab::python

PYBIND11_MODULE(_core, m) {
  namespace py = pybind11;
  m.doc() = "fp8lab's C++ core: formats, kernels, quantized ops and the results store";
  py::register_exception<fp8lab::Error>(m, "Error", PyExc_ValueError);
  fp8lab::python::bind_core(m);
  fp8lab::python::bind_nn(m);
  fp8lab::python::bind_results(m);
  fp8lab::python::bind_data(m);
}
