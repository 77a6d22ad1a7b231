// fp8lab._core, results: the SQLite results store that `fp8lab train` writes and `fp8lab runs`
// and `fp8lab report` read, so that runs trained from Python land beside them.
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "fp8lab/results/stats.hpp"
#include "fp8lab/results/store.hpp"

namespace fp8lab::python {

namespace {

using results::RunStatus;
using results::Store;

py::dict run_row(const results::RunRow& r) {
  py::dict d;
  d["id"] = r.id;
  d["created"] = r.created;
  d["name"] = r.name;
  d["kind"] = r.kind;
  d["recipe"] = r.recipe;
  d["loss_scale"] = r.loss_scale;
  d["code_version"] = r.code_version;
  d["machine"] = r.machine;
  d["status"] = std::string(results::to_string(r.status));
  d["seed"] = r.seed;
  d["final_metric"] = r.final_metric ? py::cast(*r.final_metric) : py::none();
  d["metric_name"] = r.metric_name;
  d["wall_seconds"] = r.wall_seconds;
  d["config_json"] = r.config_json;
  return d;
}

py::dict mann_whitney(const std::vector<double>& x, const std::vector<double>& y, const std::string& alt,
                      const std::string& method) {
  const results::MannWhitney r = results::mann_whitney_u(x, y, results::parse_alternative(alt), method);
  py::dict d;
  d["u"] = r.u;
  d["p"] = r.p;
  d["exact"] = r.exact;
  d["z"] = r.z;
  return d;
}

}  // namespace

void bind_results(py::module_& m) {
  m.def("mann_whitney_u", &mann_whitney, py::arg("x"), py::arg("y"), py::arg("alternative") = "two-sided",
        py::arg("method") = "auto",
        "The Mann-Whitney U test of x against y, as `fp8lab report` runs it (docs/experiments.md): "
        "{u, p, exact, z}. alternative: less (x lower), greater or two-sided; method: auto, exact or "
        "asymptotic.");
  using Row = Store::StatRow;
  py::class_<Row>(m, "StatRow", "One statistics record: a tensor kind of a layer at a step")
      .def_readonly("step", &Row::step)
      .def_readonly("layer", &Row::layer)
      .def_readonly("kind", &Row::kind)
      .def_readonly("total", &Row::total)
      .def_readonly("overflow", &Row::overflow)
      .def_readonly("underflow", &Row::underflow)
      .def_readonly("nan", &Row::nan)
      .def_readonly("absmax", &Row::absmax)
      .def_readonly("histogram_json", &Row::histogram,
                    "{\"lo\", \"counts\", \"zero\", \"inf\", \"nan\"}, and \"groups\", \"scales\" for scaled kinds");
  py::class_<Store>(m, "Store", "The results store (SQLite) of fp8lab runs")
      .def(py::init<const std::string&>(), py::arg("path"))
      .def_property_readonly("path", &Store::path)
      .def("begin_run",
           [](Store& s, const std::string& name, const std::string& kind, const std::string& config_json,
              const std::string& recipe, const std::string& loss_scale, std::uint64_t seed) {
             return s.begin_run({name, kind, config_json, recipe, loss_scale, seed});
           },
           py::arg("name"), py::arg("kind"), py::arg("config_json"), py::arg("recipe"), py::arg("loss_scale"),
           py::arg("seed"))
      .def("log_metric", &Store::log_metric, py::arg("run"), py::arg("step"), py::arg("name"), py::arg("value"))
      .def("log_loss_scale", &Store::log_loss_scale, py::arg("run"), py::arg("trace"),
           "Points (step, log2 scale, skipped)")
      .def("log_stats", &Store::log_stats, py::arg("run"), py::arg("rows"),
           "Statistics rows (QuantContext.take_stat_rows())")
      .def("finish_run",
           [](Store& s, std::int64_t run, const std::string& status, std::optional<double> metric,
              const std::string& metric_name, double seconds) {
             s.finish_run(run, results::parse_run_status(status), metric, metric_name, seconds);
           },
           py::arg("run"), py::arg("status"), py::arg("metric"), py::arg("metric_name"), py::arg("seconds"))
      .def("runs",
           [](const Store& s, std::optional<std::string> status, const std::string& recipe, const std::string& name) {
             results::RunFilter f;
             if (status) f.status = results::parse_run_status(*status);
             f.recipe = recipe;
             f.name = name;
             py::list l;
             for (const auto& r : s.runs(f)) l.append(run_row(r));
             return l;
           },
           py::kw_only(), py::arg("status") = py::none(), py::arg("recipe") = "", py::arg("name") = "")
      .def("metric", &Store::metric, py::arg("run"), py::arg("name"))
      .def("loss_scale_trace", &Store::loss_scale_trace, py::arg("run"))
      .def("stats", &Store::stats, py::arg("run"))
      .def("check", &Store::check)
      .def_static("code_version", &Store::code_version);
}

}  // namespace fp8lab::python
