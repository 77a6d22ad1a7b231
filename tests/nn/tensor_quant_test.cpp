// The passes over libtorch tensors (src/nn/tensor_quant.cpp) against the scalar codec,
// element by element: every pass, every thread count, non-contiguous inputs, both code
// widths, in place and not, and the counts.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <bit>
#include <cmath>

#include "fp8lab/core/codec.hpp"
#include "fp8lab/nn/runtime.hpp"
#include "fp8lab/nn/tensor_quant.hpp"

using namespace fp8lab;

namespace {

// Values across the whole range of the formats below: normal, subnormal, zero, overflow,
// both signs, and the special values.
torch::Tensor inputs(std::int64_t n) {
  torch::manual_seed(3);
  auto t = torch::randn({n}) * torch::exp2(torch::randint(-30, 20, {n}).to(torch::kFloat32));
  auto a = t.accessor<float, 1>();
  a[0] = 0.0f, a[1] = -0.0f, a[2] = INFINITY, a[3] = -INFINITY, a[4] = NAN, a[5] = 1e30f, a[6] = -1e-30f;
  return t;
}

QuantSpec spec(const char* format, Rounding r, Overflow o = Overflow::saturate) {
  QuantSpec q;
  q.format = parse_format(format);
  q.rounding = r;
  q.overflow = o;
  return q;
}

bool same(float a, float b) { return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b); }

// The scalar codec on element i of the flattened tensor, with stream seed `seed`.
float reference(float x, QuantSpec q, std::uint64_t seed, std::uint64_t i) {
  q.seed = seed;
  return quantize(x, q, i);
}

void expect_quantized(const torch::Tensor& in, const torch::Tensor& out, const QuantSpec& q, std::uint64_t seed) {
  ASSERT_EQ(out.numel(), in.numel());
  const auto x = in.contiguous().view(-1), y = out.contiguous().view(-1);
  const float* px = x.data_ptr<float>();
  const float* py = y.data_ptr<float>();
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    const float r = reference(px[i], q, seed, static_cast<std::uint64_t>(i));
    if (std::isnan(r)) ASSERT_TRUE(std::isnan(py[i])) << i;
    else ASSERT_TRUE(same(py[i], r)) << "element " << i << ": " << px[i] << " -> " << py[i] << ", codec " << r;
  }
}

}  // namespace

TEST(TensorQuant, EveryPassEqualsTheScalarCodecAtEveryThreadCount) {
  const auto x = inputs(7 * 14287).view({7, 14287}).slice(1, 0, 14286);  // not contiguous
  ASSERT_FALSE(x.is_contiguous());
  for (int threads : {1, 2, 3}) {
    nn::ScopedTorchSettings s({threads, false});
    for (const char* f : {"1.4.3:10", "1.5.2", "e4m3fn", "1.0.7:-2", "fp16", "e2m1fn"})
      for (Rounding r : {Rounding::nearest_even, Rounding::toward_zero, Rounding::stochastic, Rounding::nearest_away}) {
        SCOPED_TRACE(std::string(f) + " threads " + std::to_string(threads));
        const QuantSpec q = spec(f, r);
        QuantCounts c;
        const auto y = nn::fake_quantize(x, q, 77, &c);
        expect_quantized(x, y, q, 77);
        EXPECT_EQ(c.total, static_cast<std::uint64_t>(x.numel()));
        EXPECT_GE(c.overflow, 2u);  // +-Inf at least
        auto in_place = x.contiguous().clone();
        nn::fake_quantize_(in_place, q, 77);
        EXPECT_TRUE(torch::equal(in_place.nan_to_num(0), y.nan_to_num(0)));
        const auto codes = nn::encode_tensor(x, q, 77);
        EXPECT_EQ(codes.scalar_type(), q.format.width() <= 8 ? torch::kUInt8 : torch::kInt16);
        EXPECT_EQ(codes.sizes(), x.sizes());
        const auto back = nn::decode_tensor(codes, q.format);
        auto [fq, codes2] = nn::quantize_and_encode_tensor(x, q, 77);
        EXPECT_TRUE(torch::equal(codes, codes2));
        EXPECT_TRUE(torch::equal(fq.nan_to_num(0), y.nan_to_num(0)));
        // Decoding the codes gives the fake-quantized values, but for NaN inputs of a format
        // without NaN (stored as +0, kept as NaN by fake quantization).
        const auto keep = y.isnan().logical_not();
        EXPECT_TRUE(torch::equal(back.masked_select(keep), y.masked_select(keep)));
      }
  }
}

TEST(TensorQuant, StochasticStreamsDependOnTheSeedOnly) {
  const auto x = inputs(4096);
  const QuantSpec q = spec("1.5.2", Rounding::stochastic);
  const auto a = nn::fake_quantize(x, q, 5), b = nn::fake_quantize(x, q, 5), c = nn::fake_quantize(x, q, 6);
  EXPECT_TRUE(torch::equal(a.nan_to_num(0), b.nan_to_num(0)));
  EXPECT_FALSE(torch::equal(a.nan_to_num(0), c.nan_to_num(0)));
}

TEST(TensorQuant, RejectsWhatItCannotQuantize) {
  const QuantSpec q = spec("1.4.3", Rounding::nearest_even);
  EXPECT_THROW(nn::fake_quantize(torch::zeros({4}, torch::kFloat64), q, 0), Error);
  auto gaps = torch::zeros({4, 8}).slice(1, 0, 8, 2);  // not dense: every other column
  EXPECT_THROW(nn::fake_quantize_(gaps, q, 0), Error);
  auto transposed = torch::zeros({4, 4}).t();  // dense: fine, but not for stochastic rounding
  EXPECT_NO_THROW(nn::fake_quantize_(transposed, q, 0));
  EXPECT_THROW(nn::fake_quantize_(transposed, spec("1.4.3", Rounding::stochastic), 0), Error);
}

// Dense layouts other than row-major (channels-last, the compute layer's): without
// stochastic rounding read as they lie and the results laid out alike; with it, the
// row-major stream order, so the values never depend on the layout.
TEST(TensorQuant, ChannelsLastKeepsItsLayoutAndTheValues) {
  const torch::Tensor x = inputs(2 * 8 * 5 * 3).reshape({2, 8, 5, 3});
  const torch::Tensor xcl = x.contiguous(torch::MemoryFormat::ChannelsLast);
  for (Rounding r : {Rounding::nearest_even, Rounding::toward_zero, Rounding::stochastic, Rounding::nearest_away}) {
    const QuantSpec q = spec("1.4.3", r);
    const torch::Tensor want = nn::fake_quantize(x, q, 9), got = nn::fake_quantize(xcl, q, 9);
    EXPECT_TRUE(torch::equal(got.nan_to_num(0), want.nan_to_num(0))) << to_string(r);
    EXPECT_EQ(got.is_contiguous(torch::MemoryFormat::ChannelsLast), r != Rounding::stochastic) << to_string(r);
    const auto [y, codes] = nn::quantize_and_encode_tensor(xcl, q, 9);
    EXPECT_TRUE(torch::equal(y.nan_to_num(0), want.nan_to_num(0))) << to_string(r);
    EXPECT_TRUE(torch::equal(nn::decode_tensor(codes, q.format).nan_to_num(0), want.nan_to_num(0)));
    const auto b16 = nn::decode_tensor_bf16(codes, q.format);  // 1.4.3's values are bfloat16 values
    ASSERT_TRUE(b16);
    EXPECT_TRUE(torch::equal(b16->to(torch::kFloat).nan_to_num(0), want.nan_to_num(0)));
    EXPECT_EQ(b16->strides(), codes.strides());
    EXPECT_TRUE(torch::equal(nn::encode_tensor(xcl, q, 9), nn::encode_tensor(x, q, 9)));
    const auto bq = nn::quantize_bf16_tensor(xcl, q, 9, true);  // straight to bfloat16, the same stream
    ASSERT_TRUE(bq);
    EXPECT_TRUE(torch::equal(bq->values.to(torch::kFloat).nan_to_num(0), want.nan_to_num(0))) << to_string(r);
    EXPECT_TRUE(torch::equal(bq->codes, nn::encode_tensor(x, q, 9))) << to_string(r);
    if (r == Rounding::stochastic) continue;
    torch::Tensor in_place = xcl.clone();
    nn::fake_quantize_(in_place, q, 9);
    EXPECT_TRUE(torch::equal(in_place.nan_to_num(0), want.nan_to_num(0))) << to_string(r);
  }
}

TEST(TorchSettings, ScopedSettingsAreRestored) {
  const nn::TorchSettings before = nn::current_torch_settings();
  {
    nn::ScopedTorchSettings s({before.threads + 1, !before.flush_denormals});
    EXPECT_EQ(nn::current_torch_settings().threads, before.threads + 1);
    EXPECT_EQ(nn::current_torch_settings().flush_denormals, !before.flush_denormals);
  }
  EXPECT_EQ(nn::current_torch_settings().threads, before.threads);
  EXPECT_EQ(nn::current_torch_settings().flush_denormals, before.flush_denormals);
  EXPECT_EQ(nn::current_torch_settings().blas_threads, before.blas_threads);
}

// torch::set_num_threads leaves OpenBLAS's pool alone; a run's thread count must reach it
// too, or a one-thread run keeps OpenBLAS workers spinning beside it.
TEST(TorchSettings, BlasThreadsFollowThreadsAndAreRestored) {
  if (nn::blas_core().empty()) GTEST_SKIP() << "libtorch's BLAS is not OpenBLAS here";
  const nn::TorchSettings before = nn::current_torch_settings();
  ASSERT_GE(before.blas_threads, 1);
  const int other = before.blas_threads == 1 ? 2 : 1;
  {
    nn::ScopedTorchSettings s({other, before.flush_denormals});
    EXPECT_EQ(nn::blas_threads(), other);
    EXPECT_EQ(nn::current_torch_settings().blas_threads, other);
  }
  EXPECT_EQ(nn::blas_threads(), before.blas_threads);
  {
    nn::ScopedTorchSettings s({1, before.flush_denormals, 3});  // an explicit count wins
    EXPECT_EQ(nn::blas_threads(), 3);
    EXPECT_EQ(nn::current_torch_settings().threads, 1);
  }
  EXPECT_EQ(nn::blas_threads(), before.blas_threads);
}

// libtorch's exceptions quoted in fp8lab's messages lose the C++ backtrace libtorch appends.
TEST(TorchSettings, TorchErrorsAreQuotedWithoutTheirBacktrace) {
  try {
    (void)torch::zeros({2, 3}).mm(torch::zeros({4, 5}));
    FAIL() << "mm of mismatched shapes did not throw";
  } catch (const std::exception& e) {
    const std::string t = nn::torch_error_text(e);
    EXPECT_NE(t.find("cannot be multiplied"), std::string::npos) << t;
    EXPECT_EQ(t.find("Exception raised from"), std::string::npos) << t;
    EXPECT_EQ(t.find('\n'), std::string::npos) << t;
    EXPECT_EQ(t.find("frame #"), std::string::npos) << t;
  }
  EXPECT_EQ(nn::torch_error_text(std::runtime_error(std::string(400, 'x')), 10), "xxxxxxxxxx...");
}

// Both forms of a matrix in one read (scaled_quantize_matrix_both): each ScaledTensor equals
// scaled_quantize_matrix's of the matrix and of its transpose (read as it lies), form by
// form (values, codes, scales, tensor scale, amax, counts, the bfloat16 form in the layout
// asked for, with and without the tensor scale), for an MX and a two-level spec under
// stochastic rounding, each form with its own seed and call; a matrix
// that is not contiguous is refused by name.
TEST(TensorQuant, BothFormsOfAMatrixEqualTwoQuantizations) {
  const auto equal = [](const torch::Tensor& a, const torch::Tensor& b) {
    if (a.defined() != b.defined()) return false;
    if (!a.defined()) return true;
    return a.sizes() == b.sizes() && a.strides() == b.strides() &&
           torch::equal(a.contiguous().view(torch::kUInt8), b.contiguous().view(torch::kUInt8));
  };
  const auto expect_equal = [&](const nn::ScaledTensor& a, const nn::ScaledTensor& b, const std::string& what) {
    EXPECT_TRUE(equal(a.values, b.values)) << what << " values";
    EXPECT_TRUE(equal(a.codes, b.codes)) << what << " codes";
    EXPECT_TRUE(equal(a.scales, b.scales)) << what << " scales";
    EXPECT_TRUE(equal(a.bf16, b.bf16)) << what << " bf16";
    EXPECT_EQ(a.transposed, b.transposed) << what;
    EXPECT_EQ(std::bit_cast<std::uint32_t>(a.tensor_scale), std::bit_cast<std::uint32_t>(b.tensor_scale)) << what;
    EXPECT_EQ(a.amax, b.amax) << what;
    EXPECT_EQ(a.without_tensor_scale, b.without_tensor_scale) << what;
  };
  torch::manual_seed(5);
  const torch::Tensor m = torch::randn({256, 64}) * torch::exp2(torch::randint(-6, 6, {256, 1}).to(torch::kFloat32));
  for (const char* name : {"mxfp8_e4m3", "nvfp4"})
    for (const bool apart : {false, true}) {
      ScaledSpec s = parse_scaled(name);
      s.element.rounding = Rounding::stochastic;  // each form's seed counts
      const std::string what = std::string(name) + (apart ? " without the tensor scale" : "");
      const nn::ScaledForms rows{.bf16 = true, .bf16_as_given = true, .without_tensor_scale = apart};
      const nn::ScaledForms cols{.values = true, .codes = true, .bf16 = true, .bf16_as_given = true,
                                 .without_tensor_scale = apart};
      ScaledCall call;
      call.index_offset = 9;
      ScaledCounts c, c2, want_c;
      const auto [q, q2] = nn::scaled_quantize_matrix_both(m, s, {11, call, rows, &c}, {12, {}, cols, &c2});
      const nn::ScaledTensor want = nn::scaled_quantize_matrix(m, s, 11, call, rows, &want_c);
      ScaledCall known;
      known.known_amax = want.amax;
      ScaledCounts want_c2;
      const nn::ScaledTensor want2 = nn::scaled_quantize_matrix(m.t(), s, 12, known, cols, &want_c2);
      ASSERT_TRUE(want2.transposed) << what << ": the transpose is read as it lies";
      expect_equal(q, want, what + " row form");
      expect_equal(q2, want2, what + " column form");
      EXPECT_EQ(c, want_c) << what;
      EXPECT_EQ(c2, want_c2) << what;
      if (!s.tensor_scale || apart)  // a float32 tensor scale folded in leaves values inexact in bfloat16
        EXPECT_TRUE(q.bf16.defined() && q2.bf16.defined()) << what << ": the test needs bfloat16 forms";
    }
  try {
    (void)nn::scaled_quantize_matrix_both(m.t(), parse_scaled("mxfp8_e4m3"), {}, {});
    FAIL() << "a transposed matrix was taken as contiguous";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected a contiguous matrix"), std::string::npos) << e.what();
  }
}
