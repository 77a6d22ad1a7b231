// libfp8lab_onednn.so (onednn_api.h): matmul and convolution primitives on bfloat16
// operands with float32 accumulation and output, through Debian's oneDNN 2.x. Compiled
// without torch's include path, so that <oneapi/dnnl/dnnl.hpp> is the header of the
// libdnnl.so.2 it links.
#include "onednn_api.h"

#include <array>
#include <cstdint>
#include <exception>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>

namespace {

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// The message of the last failed call on this thread.
const char* failure(const char* what, const std::exception& e) {
  static thread_local std::string message;
  message = std::string(what) + ": oneDNN: " + e.what();
  return message.c_str();
}

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;
using dims = dnnl::memory::dims;

// ---- matmul: one primitive per shape and operand layout, created once. ----------------

struct MatmulKey {
  std::int64_t batch, m, k, n, a_rs, a_cs, b_rs, b_cs;  // batch 0: plain 2-D matrices
  auto tie() const { return std::tie(batch, m, k, n, a_rs, a_cs, b_rs, b_cs); }
  bool operator<(const MatmulKey& o) const { return tie() < o.tie(); }
};

struct MatmulPrim {
  dnnl::memory::desc a, b, c;
  dnnl::matmul prim;
};

const MatmulPrim& matmul_primitive(const MatmulKey& key) {
  static std::mutex m;
  static std::map<MatmulKey, MatmulPrim> cache;
  std::lock_guard<std::mutex> lk(m);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  MatmulPrim p;
  if (key.batch == 0) {
    p.a = dnnl::memory::desc({key.m, key.k}, dt::bf16, {key.a_rs, key.a_cs});
    p.b = dnnl::memory::desc({key.k, key.n}, dt::bf16, {key.b_rs, key.b_cs});
    p.c = dnnl::memory::desc({key.m, key.n}, dt::f32, {key.n, 1});
  } else {  // matrices back to back, each row- or column-major
    p.a = dnnl::memory::desc({key.batch, key.m, key.k}, dt::bf16, {key.m * key.k, key.a_rs, key.a_cs});
    p.b = dnnl::memory::desc({key.batch, key.k, key.n}, dt::bf16, {key.k * key.n, key.b_rs, key.b_cs});
    p.c = dnnl::memory::desc({key.batch, key.m, key.n}, dt::f32, {key.m * key.n, key.n, 1});
  }
  p.prim = dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(p.a, p.b, p.c), engine()));
  return cache.emplace(key, std::move(p)).first->second;
}

const char* run_matmul(std::int64_t batch, std::int64_t m, std::int64_t k, std::int64_t n, std::int64_t a_rs,
                       std::int64_t a_cs, std::int64_t b_rs, std::int64_t b_cs, const void* a, const void* b,
                       float* c) {
  try {
    const MatmulPrim& p = matmul_primitive({batch, m, k, n, a_rs, a_cs, b_rs, b_cs});
    dnnl::memory am(p.a, engine(), const_cast<void*>(a)), bm(p.b, engine(), const_cast<void*>(b)),
        cm(p.c, engine(), c);
    dnnl::stream s(engine());
    p.prim.execute(s, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
    s.wait();
    return nullptr;
  } catch (const std::exception& e) {
    return failure("bfloat16 matrix product", e);
  }
}

// ---- convolutions: one primitive per pass, shape and geometry, created once. -----------

struct ConvKey {
  int pass;
  fp8lab_conv_shape s;
  auto tie() const {
    return std::tie(pass, s.n, s.c, s.h, s.w, s.o, s.kh, s.kw, s.oh, s.ow, s.stride[0], s.stride[1], s.padding[0],
                    s.padding[1], s.dilation[0], s.dilation[1], s.groups);
  }
  bool operator<(const ConvKey& k) const { return tie() < k.tie(); }
};

// One argument of a primitive: its layout as torch holds it (channels-last activations,
// OIHW weights) and as the primitive wants it, with the reorder between them where they
// differ.
struct Arg {
  int id;
  dnnl::memory::desc user, inner;
  dnnl::reorder reorder;  // user -> inner for inputs, inner -> user for the output
  bool reordered() const { return !(user == inner); }
};

struct ConvPrim {
  dnnl::primitive prim;
  std::array<Arg, 3> args;  // two inputs, then the output
};

// Activations (inputs, outputs and their gradients) are channels-last, the layout of
// oneDNN's matrix-engine convolutions: the tensors the products return are channels-last,
// so the next layer's operands need no reorder.
dnnl::memory::desc activation(const fp8lab_conv_shape& k, bool output, dt type) {
  return output ? dnnl::memory::desc({k.n, k.o, k.oh, k.ow}, type, tag::nhwc)
                : dnnl::memory::desc({k.n, k.c, k.h, k.w}, type, tag::nhwc);
}

// Weights [O, C/g, kh, kw] as torch lays them; oneDNN's grouped form [g, O/g, C/g, kh, kw]
// is the same bytes.
dnnl::memory::desc weights(const fp8lab_conv_shape& k, dt type) {
  const std::int64_t g = k.groups;
  if (g == 1) return dnnl::memory::desc({k.o, k.c, k.kh, k.kw}, type, tag::oihw);
  return dnnl::memory::desc({g, k.o / g, k.c / g, k.kh, k.kw}, type, tag::goihw);
}

dnnl::memory::desc any_like(const dnnl::memory::desc& d) {
  return dnnl::memory::desc(d.dims(), d.data_type(), tag::any);
}

Arg make_arg(int id, const dnnl::memory::desc& user, const dnnl::memory::desc& inner, bool output) {
  Arg a{id, user, inner, {}};
  if (a.reordered())
    a.reorder = output ? dnnl::reorder(dnnl::reorder::primitive_desc(engine(), inner, engine(), user))
                       : dnnl::reorder(dnnl::reorder::primitive_desc(engine(), user, engine(), inner));
  return a;
}

// The primitive with activations as given (channels-last) and weights in the layout it
// prefers; `any_layout` leaves the activations' layouts to oneDNN too (for the rare
// geometry without a channels-last implementation).
ConvPrim create(const ConvKey& key, bool any_layout) {
  const fp8lab_conv_shape& k = key.s;
  const dims strides{k.stride[0], k.stride[1]};
  const dims dilates{k.dilation[0] - 1, k.dilation[1] - 1};  // oneDNN counts the gaps
  const dims pad_l{k.padding[0], k.padding[1]};
  // The right padding that makes oneDNN's output size torch's (which rounds down).
  const dims pad_r{(k.oh - 1) * k.stride[0] + (k.kh - 1) * k.dilation[0] + 1 - k.h - k.padding[0],
                   (k.ow - 1) * k.stride[1] + (k.kw - 1) * k.dilation[1] + 1 - k.w - k.padding[1]};
  const auto x16 = activation(k, false, dt::bf16), y16 = activation(k, true, dt::bf16);
  const auto x32 = activation(k, false, dt::f32), y32 = activation(k, true, dt::f32);
  const auto w16 = weights(k, dt::bf16), w32 = weights(k, dt::f32);
  const auto act = [&](const dnnl::memory::desc& d) { return any_layout ? any_like(d) : d; };
  const auto algo = dnnl::algorithm::convolution_direct;
  const dnnl::convolution_forward::primitive_desc fwd(
      dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, algo, act(x16), any_like(w16), act(y32),
                                      strides, dilates, pad_l, pad_r),
      engine());
  switch (key.pass) {
    case FP8LAB_CONV_FORWARD:
      return {dnnl::convolution_forward(fwd),
              {make_arg(DNNL_ARG_SRC, x16, fwd.src_desc(), false),
               make_arg(DNNL_ARG_WEIGHTS, w16, fwd.weights_desc(), false),
               make_arg(DNNL_ARG_DST, y32, fwd.dst_desc(), true)}};
    case FP8LAB_CONV_INPUT_GRAD: {
      const dnnl::convolution_backward_data::primitive_desc pd(
          dnnl::convolution_backward_data::desc(algo, act(x32), any_like(w16), act(y16), strides, dilates, pad_l,
                                                pad_r),
          engine(), fwd);
      return {dnnl::convolution_backward_data(pd),
              {make_arg(DNNL_ARG_DIFF_DST, y16, pd.diff_dst_desc(), false),
               make_arg(DNNL_ARG_WEIGHTS, w16, pd.weights_desc(), false),
               make_arg(DNNL_ARG_DIFF_SRC, x32, pd.diff_src_desc(), true)}};
    }
    case FP8LAB_CONV_WEIGHT_GRAD: {
      const dnnl::convolution_backward_weights::primitive_desc pd(
          dnnl::convolution_backward_weights::desc(algo, act(x16), any_like(w32), act(y16), strides, dilates,
                                                   pad_l, pad_r),
          engine(), fwd);
      return {dnnl::convolution_backward_weights(pd),
              {make_arg(DNNL_ARG_DIFF_DST, y16, pd.diff_dst_desc(), false),
               make_arg(DNNL_ARG_SRC, x16, pd.src_desc(), false),
               make_arg(DNNL_ARG_DIFF_WEIGHTS, w32, pd.diff_weights_desc(), true)}};
    }
  }
  throw std::invalid_argument("unknown convolution pass " + std::to_string(key.pass));
}

ConvPrim create(const ConvKey& k) {
  try {
    return create(k, false);
  } catch (const dnnl::error&) {  // no implementation for channels-last activations
    return create(k, true);
  }
}

const ConvPrim& conv_primitive(const ConvKey& k) {
  static std::mutex m;
  static std::map<ConvKey, ConvPrim> cache;
  std::lock_guard<std::mutex> lk(m);
  auto it = cache.find(k);
  if (it == cache.end()) it = cache.emplace(k, create(k)).first;
  return it->second;
}

// A buffer for a primitive's own layout of an argument.
dnnl::memory scratch(const dnnl::memory::desc& d, std::vector<std::vector<std::uint8_t>>& keep) {
  keep.emplace_back(d.get_size());
  return dnnl::memory(d, engine(), keep.back().data());
}

// Runs the primitive on two bfloat16 inputs, writing the float32 output `out` (as the user
// descriptions lay them), through the reorders the primitive's layouts need.
void run(const ConvPrim& p, const void* in0, const void* in1, float* out) {
  dnnl::stream s(engine());
  std::vector<std::vector<std::uint8_t>> keep;
  keep.reserve(3);  // buffers stay where they are
  std::unordered_map<int, dnnl::memory> args;
  const void* inputs[2] = {in0, in1};
  for (int i = 0; i < 2; ++i) {
    const Arg& a = p.args[static_cast<std::size_t>(i)];
    dnnl::memory user(a.user, engine(), const_cast<void*>(inputs[i]));
    if (!a.reordered()) {
      args.emplace(a.id, user);
      continue;
    }
    dnnl::memory inner = scratch(a.inner, keep);
    a.reorder.execute(s, user, inner);
    args.emplace(a.id, inner);
  }
  const Arg& o = p.args[2];
  dnnl::memory user(o.user, engine(), out);
  dnnl::memory inner = o.reordered() ? scratch(o.inner, keep) : user;
  args.emplace(o.id, inner);
  p.prim.execute(s, args);
  if (o.reordered()) o.reorder.execute(s, inner, user);
  s.wait();
}

const char* run_conv(int pass, const fp8lab_conv_shape* shape, const void* in0, const void* in1, float* out) {
  try {
    run(conv_primitive({pass, *shape}), in0, in1, out);
    return nullptr;
  } catch (const std::exception& e) {
    return failure("bfloat16 convolution", e);
  }
}

int bf16_products() {
  try {
    const auto isa = dnnl::get_effective_cpu_isa();
    return isa == dnnl::cpu_isa::avx512_core_bf16 || isa == dnnl::cpu_isa::avx512_core_amx;
  } catch (const std::exception&) {
    return 0;
  }
}

const char* cpu_isa() {
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::sse41: return "sse41";
    case dnnl::cpu_isa::avx: return "avx";
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    default: return "other";
  }
}

const fp8lab_onednn_api kApi{FP8LAB_ONEDNN_API_VERSION, bf16_products, cpu_isa, run_matmul, run_conv};

}  // namespace

extern "C" __attribute__((visibility("default"))) const fp8lab_onednn_api* fp8lab_onednn(void) { return &kApi; }
