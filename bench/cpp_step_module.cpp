// fp8lab_cpp_step: the C++ library's own training step of a CIFAR ResNet, timed in the same
// process as the same step written in Python (bench/bench_python.py), so that the cost Python
// adds is measured on the same threads and the same inputs. A module of its own beside the
// package (build/bench), not part of fp8lab's.
#include <torch/extension.h>

#include <chrono>

#include "fp8lab/models/resnet.hpp"
#include "fp8lab/settings/compute_spec.hpp"
#include "fp8lab/nn/modules.hpp"

namespace {

using namespace fp8lab;
namespace py = pybind11;

class CppResNetStep {
 public:
  CppResNetStep(int depth, int width, int batch, const std::string& recipe, const std::string& compute) {
    torch::manual_seed(0);
    models::CifarResNetOptions o;
    o.depth = depth;
    o.width = width;
    model_ = models::CifarResNet(o);
    ctx_ = std::make_shared<nn::QuantContext>();
    ctx_->compute = nn::parse_compute(compute);
    nn::quantize_model(*model_, nn::load_recipe(recipe), ctx_);
    x_ = torch::randn({batch, 3, 32, 32});
    t_ = torch::randint(0, 10, {batch});
    opt_ = std::make_unique<torch::optim::SGD>(model_->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  }
  // One step (zero_grad, forward, loss, backward, SGD) in milliseconds.
  double step() {
    const auto t0 = std::chrono::steady_clock::now();
    opt_->zero_grad();
    torch::nn::functional::cross_entropy(model_->forward(x_), t_).backward();
    opt_->step();
    ctx_->step++;
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }

 private:
  models::CifarResNet model_{nullptr};
  std::shared_ptr<nn::QuantContext> ctx_;
  torch::Tensor x_, t_;
  std::unique_ptr<torch::optim::SGD> opt_;
};

}  // namespace

PYBIND11_MODULE(fp8lab_cpp_step, m) {
  m.doc() = "The C++ library's training step, the reference of bench/bench_python.py";
  py::class_<CppResNetStep>(m, "CppResNetStep")
      .def(py::init<int, int, int, const std::string&, const std::string&>(), py::arg("depth"), py::arg("width"),
           py::arg("batch"), py::arg("recipe"), py::arg("compute") = "fp32")
      .def("step", &CppResNetStep::step, py::call_guard<py::gil_scoped_release>());
}
