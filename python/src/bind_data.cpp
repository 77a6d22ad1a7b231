// fp8lab._core, data and plots: the Bible corpus the CLI's Transformer studies train on, and
// the report's line plots (SVG and PNG), for examples and notebooks in Python.
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "fp8lab/data/bitext.hpp"
#include "fp8lab/results/plot.hpp"

namespace fp8lab::python {

void bind_data(py::module_& m) {
  m.def(
      "bible_corpus",
      [](const std::string& dir) {
        data::CorpusFiles c;
        {
          py::gil_scoped_release nogil;
          c = data::prepare_bible_corpus(dir);
        }
        py::dict d;
        d["dir"] = c.dir;
        d["pairs"] = c.report.pairs;
        return d;
      },
      py::arg("dir"),
      "Prepares the English-Spanish Bible corpus into `dir` ({train,dev,test}.{en,es,ref}; docs/data.md) from "
      "Debian's SWORD modules, or reuses it there");
  m.def(
      "plot_lines",
      [](const std::string& stem, const std::vector<std::tuple<std::string, std::vector<double>, std::vector<double>>>&
             series, const std::string& title, const std::string& xlabel, const std::string& ylabel) {
        results::plot::Figure f;
        results::plot::Panel p;
        p.title = title;
        p.xlabel = xlabel;
        p.ylabel = ylabel;
        for (const auto& [label, x, y] : series) {
          if (x.size() != y.size())
            throw Error("plot_lines: series '" + label + "' has " + std::to_string(x.size()) + " x and " +
                        std::to_string(y.size()) + " y values");
          results::plot::Series s;
          s.label = label;
          s.x = x;
          s.y = y;
          s.markers = false;
          p.series.push_back(std::move(s));
        }
        f.panels.push_back(std::move(p));
        py::gil_scoped_release nogil;
        results::plot::save(f, stem);
      },
      py::arg("stem"), py::arg("series"), py::arg("title") = "", py::arg("xlabel") = "", py::arg("ylabel") = "",
      "Writes <stem>.svg and <stem>.png: one panel of lines, series as (label, x, y)");
}

}  // namespace fp8lab::python
