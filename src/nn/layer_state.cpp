// A quantized layer's quantization of its op's tensors (layer_state.hpp): the recipe's
// quantizer for each kind, drawing on the layer's streams, histories and statistics.
#include <ATen/ATen.h>
#include <torch/torch.h>

#include "fp8lab/core/random.hpp"
#include "fp8lab/nn/layer_state.hpp"

#include <bit>

namespace fp8lab::nn {

namespace {
// A layer's seed: the run seed mixed with its module path.
std::uint64_t layer_seed_of(std::uint64_t run_seed, const std::string& name) {
  std::uint64_t h = mix64(run_seed);
  for (char c : name) h = mix64(h ^ static_cast<unsigned char>(c));
  return h;
}
// The call for a second quantization of the values `first` quantized (along another axis):
// their amax is known, unless the Hadamard transform changes the values first.
ScaledCall same_values(ScaledCall sc, const ScaledTensor& first, bool hadamard) {
  if (!hadamard) sc.known_amax = first.amax;
  return sc;
}
}  // namespace

LayerState::LayerState(std::string name_, const LayerQuant& q, std::shared_ptr<QuantContext> ctx_, int index_)
    : name(std::move(name_)),
      index(index_),
      quant(q),
      ctx(ctx_ ? std::move(ctx_) : std::make_shared<QuantContext>()),
      streams(*ctx, layer_seed_of(ctx->seed, name)),
      amax(*ctx, quant, name),
      stats(*ctx, quant, name),
      products(*ctx) {}

LayerStatePtr make_layer_state(std::string name, const LayerQuant& q, std::shared_ptr<QuantContext> ctx, int index) {
  auto st = c10::make_intrusive<LayerState>(std::move(name), q, std::move(ctx), index);
  (void)backward_grad_refs();  // measured here, outside any backward pass
  return st;
}

namespace {
// The forms a quantization of ScaledOutputs `out` makes (`apart`: without the tensor scale).
ScaledForms forms_of(const ScaledOutputs& out, bool apart) {
  return {.values = out.values && !out.bf16, .codes = out.codes, .bf16 = out.bf16, .bf16_as_given = true,
          .without_tensor_scale = apart};
}
}  // namespace

std::vector<float> LayerState::hadamard_signs(std::uint32_t call, BackwardProduct product) const {
  const int n = quant.hadamard;
  switch (quant.hadamard_signs) {
    case HadamardSigns::random: return streams.hadamard_signs_for(call, product, n);
    case HadamardSigns::none: return std::vector<float>(static_cast<std::size_t>(n), 1.0f);
    case HadamardSigns::te: {
      const auto& s = fixed_hadamard_signs(HadamardSigns::te);
      if (n != static_cast<int>(s.size()))
        throw Error("layer '" + name + "': hadamard_signs = te is TransformerEngine's 16 fixed signs; hadamard = " +
                    std::to_string(n) + " needs random or none");
      return {s.begin(), s.end()};
    }
  }
  return {};
}

ScaledTensor LayerState::quantize_scaled(TensorKind k, const torch::Tensor& t, const MatrixView& v,
                                         std::uint32_t call, std::uint32_t stream, const ScaledCall& sc,
                                         ScaledOutputs out) {
  const bool transform = out.hadamard != BackwardProduct::none;
  torch::Tensor m = transform ? to_matrix(t, v) : matrix_of(t, v);
  if (transform) {
    if (m.is_same(t) || m.data_ptr() == t.data_ptr()) m = m.clone();
    hadamard_(m, hadamard_signs(call, out.hadamard));
  }
  return quantize_scaled_matrix(k, t, m, call, stream, sc, out);
}

ScaledTensor LayerState::quantize_scaled_matrix(TensorKind k, const torch::Tensor& t, const torch::Tensor& m,
                                                std::uint32_t call, std::uint32_t stream, const ScaledCall& sc,
                                                const ScaledOutputs& out) {
  ScaledCounts c;
  const std::uint64_t seed = streams.seed_for(k, call, stream);
  const ScaledSpec& s = spec(k, out.backward_form);
  const bool apart = out.operand && s.tensor_scale_on_output();
  ScaledTensor q = scaled_quantize_matrix(m, s, seed, sc, forms_of(out, apart), out.count ? &c : nullptr);
  if (out.count) stats.record(k, {t, c.elements, &c, &q}, call);
  values_where_not_bf16(k, q, m, seed, sc, out);
  return q;
}

void LayerState::values_where_not_bf16(TensorKind k, ScaledTensor& q, const torch::Tensor& m, std::uint64_t seed,
                                       const ScaledCall& sc, const ScaledOutputs& out) const {
  if (!out.bf16 || q.bf16.defined() || !out.values) return;
  const ScaledSpec& s = spec(k, out.backward_form);
  const bool apart = out.operand && s.tensor_scale_on_output();
  q.values = scaled_quantize_matrix(m, s, seed, sc, {.values = true, .without_tensor_scale = apart}).values;
}

std::pair<ScaledTensor, ScaledTensor> LayerState::quantize_scaled_twice(TensorKind k, const torch::Tensor& t,
                                                                        std::uint32_t call, const ScaledCall& sc,
                                                                        const ScaledQuantization& first,
                                                                        const ScaledQuantization& second) {
  const bool first_transformed = first.out.hadamard != BackwardProduct::none;
  const bool second_transformed = second.out.hadamard != BackwardProduct::none;
  if (first_transformed) {  // g's form for grad_x under hadamard_on = backward: each its own way
    ScaledTensor q = quantize_scaled(k, t, first.view, call, first.stream, sc, first.out);
    return {q, quantize_scaled(k, t, second.view, call, second.stream, same_values(sc, q, true), second.out)};
  }
  const torch::Tensor m = matrix_of(t, first.view);
  const torch::Tensor mt = second_transformed ? torch::Tensor() : matrix_of(t, second.view);
  if (!mt.defined() || !is_transpose_of(mt, m)) {
    ScaledTensor q = quantize_scaled_matrix(k, t, m, call, first.stream, sc, first.out);
    const ScaledCall sc2 = same_values(sc, q, second_transformed);
    ScaledTensor q2 = mt.defined() ? quantize_scaled_matrix(k, t, mt, call, second.stream, sc2, second.out)
                                   : quantize_scaled(k, t, second.view, call, second.stream, sc2, second.out);
    return {std::move(q), std::move(q2)};
  }
  const bool apart_first = first.out.operand && quant[k]->tensor_scale_on_output();
  const bool apart_second = second.out.operand && quant[k]->tensor_scale_on_output();
  ScaledCounts c, c2;
  const ScaledForm f{streams.seed_for(k, call, first.stream), sc, forms_of(first.out, apart_first),
                     first.out.count ? &c : nullptr};
  const ScaledForm f2{streams.seed_for(k, call, second.stream), sc, forms_of(second.out, apart_second),
                      second.out.count ? &c2 : nullptr};
  auto [q, q2] = scaled_quantize_matrix_both(m, *quant[k], f, f2);
  if (first.out.count) stats.record(k, {t, c.elements, &c, &q}, call);
  if (second.out.count) stats.record(k, {t, c2.elements, &c2, &q2}, call);
  values_where_not_bf16(k, q, m, f.seed, sc, first.out);
  values_where_not_bf16(k, q2, mt, f2.seed, same_values(sc, q, false), second.out);
  return {std::move(q), std::move(q2)};
}

namespace {
// What a scaled operand's quantization makes: with its float32 group scales apart, codes
// (its elements and scales; LayerState::apart_operand); else `others`.
ScaledOutputs operand_outputs(bool apart, ScaledOutputs others) {
  return apart ? ScaledOutputs{.values = false, .codes = true, .count = others.count, .hadamard = others.hadamard,
                               .operand = true, .backward_form = others.backward_form}
               : others;
}
}  // namespace

std::pair<ProductOperand, c10::intrusive_ptr<SavedScaled>> LayerState::quantize_scaled_operand(
    TensorKind k, const torch::Tensor& t, std::uint32_t call, const ScaledOperand& o) {
  const ScaledCall sc = amax.scaled_call(k, o.operand);
  auto saved = saved_operand(k, t, o, false);
  const bool apart = saved->scales_apart;
  const bool codes = saves_codes(k) || apart;
  // The backward product's operand: its own blocks, from the float32 tensor, its own stream
  // (the same values, so the same tensor amax, unless the Hadamard transform changes them).
  const BackwardProduct hadamard = hadamard_applies(o.product, k) ? o.product : BackwardProduct::none;
  ScaledTensor f;
  std::tie(f, saved->q) = quantize_scaled_twice(
      k, t, call, sc,
      {o.fwd, o.operand, operand_outputs(apart, {.bf16 = o.for_products && scaled_bf16(k), .operand = true})},
      {o.bwd, o.operand + 2,
       operand_outputs(apart, {.values = !codes, .codes = codes, .count = false, .hadamard = hadamard, .operand = true})});
  count_saved(*saved);
  amax.push(k, o.operand, f.amax);
  return {forward_operand(k, f, t, o, apart), saved};
}

ProductOperand LayerState::forward_operand(TensorKind k, const ScaledTensor& f, const torch::Tensor& t,
                                           const ScaledOperand& o, bool apart) const {
  if (apart) return apart_operand(k, f, t.sizes(), o.fwd, o.for_products);
  return {operand_tensor(k, f.bf16.defined() ? f.bf16 : f.values, t.sizes(), o.fwd, o.for_products, o.layout),
          f.output_factor()};
}

ProductOperand LayerState::quantize_forward_operand(TensorKind k, const torch::Tensor& t, std::uint32_t call,
                                                    const ScaledOperand& o, torch::Tensor* values) {
  if (!scaled(k)) {
    torch::Tensor y = quantize(k, t, call, o.operand);
    if (values) *values = y;
    return {y};
  }
  const ScaledCall sc = amax.scaled_call(k, o.operand);
  if (values)  // the same quantization (stream, scale inputs) as the operand's, its whole values
    *values = from_matrix(quantize_scaled(k, t, o.fwd, call, o.operand, sc, {.count = false}).values, t.sizes(), o.fwd);
  const bool apart = scales_apart(k, o.scales_apart);
  const ScaledTensor f = quantize_scaled(
      k, t, o.fwd, call, o.operand, sc,
      operand_outputs(apart, {.bf16 = o.for_products && scaled_bf16(k), .operand = true}));
  amax.push(k, o.operand, f.amax);
  return forward_operand(k, f, t, o, apart);
}

c10::intrusive_ptr<SavedScaled> LayerState::quantize_backward_form(TensorKind k, const torch::Tensor& t,
                                                                   std::uint32_t call, const ScaledOperand& o) {
  auto saved = saved_operand(k, t, o, true);
  const bool apart = saved->scales_apart;
  const bool codes = saves_codes(k) || apart;
  const BackwardProduct hadamard = hadamard_applies(o.product, k) ? o.product : BackwardProduct::none;
  // Not counted: a kind's counts are its forward operand's (docs/spec.md §6.12).
  saved->q = quantize_scaled(k, t, o.bwd, call, o.operand + 2, ScaledCall{},
                             operand_outputs(apart, {.values = !codes, .codes = codes, .count = false,
                                                     .hadamard = hadamard, .operand = true, .backward_form = true}));
  count_saved(*saved);
  return saved;
}

c10::intrusive_ptr<SavedScaled> LayerState::saved_operand(TensorKind k, const torch::Tensor& t, const ScaledOperand& o,
                                                          bool backward_form) const {
  auto saved = c10::make_intrusive<SavedScaled>();
  saved->kind = k;
  saved->backward_form = backward_form;
  saved->view = o.bwd;
  saved->shape = t.sizes().vec();
  saved->scales_apart = o.scales_apart && (backward_form || scaled(k)) && spec(k, backward_form).scales_on_output();
  return saved;
}

void LayerState::count_saved(const SavedScaled& saved) const {
  const ScaledTensor& q = saved.q;
  saved_bytes(saved.kind) += q.codes.defined() ? q.codes.numel() + q.scales.numel() * 4 : q.values.numel() * 4;
}

ProductOperand LayerState::restore(const SavedScaled& saved, bool for_products, OperandLayout layout) const {
  const bool bwd = saved.backward_form;
  if (saved.scales_apart) return apart_operand(saved.kind, saved.q, saved.shape, saved.view, for_products, bwd);
  const float factor = saved.q.output_factor();
  const ScaledSpec& s = spec(saved.kind, bwd);
  if (saved.q.codes.defined() && for_products && scaled_bf16(saved.kind, bwd))  // no float32 values on the way
    if (std::optional<torch::Tensor> b = scaled_decode_matrix_bf16(saved.q, s))
      return {operand_tensor(saved.kind, *b, saved.shape, saved.view, for_products, layout, bwd), factor};
  const torch::Tensor m = saved.q.codes.defined() ? scaled_decode_matrix(saved.q, s) : saved.q.values;
  return {operand_tensor(saved.kind, m, saved.shape, saved.view, for_products, layout, bwd), factor};
}

ProductOperand LayerState::apart_operand(TensorKind k, const ScaledTensor& q, at::IntArrayRef shape,
                                         const MatrixView& v, bool for_products, bool backward_form) const {
  const ScaledSpec& s = spec(k, backward_form);
  // The elements: the codes decoded under scales of 1.
  ScaledTensor unit = q;
  unit.scales = torch::full_like(q.scales, static_cast<std::int32_t>(std::bit_cast<std::uint32_t>(1.0f)));
  unit.tensor_scale = 1;
  unit.without_tensor_scale = false;
  torch::Tensor m;
  if (for_products && ctx->compute != Compute::fp32 && bf16_products_available())
    if (std::optional<torch::Tensor> b = scaled_decode_matrix_bf16(unit, s)) m = std::move(*b);
  if (!m.defined()) m = scaled_decode_matrix(unit, s);
  ProductOperand out{operand_tensor(k, m, shape, v, for_products, OperandLayout::as_float32, backward_form)};
  const auto rows = static_cast<std::size_t>(q.codes.size(0)), cols = static_cast<std::size_t>(q.codes.size(1));
  const torch::Tensor grid = q.scales.view(torch::kFloat32);  // float32 scale codes are the floats' bits
  if (s.granularity == Granularity::tensor) {
    if (grid.numel() > 0) out.factor = grid[0].item<float>();
    return out;
  }
  const BlockLayout l = block_layout(s, rows, cols);
  torch::Tensor r = grid.reshape({static_cast<std::int64_t>(l.grid_rows()), static_cast<std::int64_t>(l.grid_cols())});
  if (l.block_rows > 1)
    r = r.repeat_interleave(static_cast<std::int64_t>(l.block_rows), 0).narrow(0, 0, static_cast<std::int64_t>(rows));
  out.scales = {r.contiguous(), std::max<std::int64_t>(1, static_cast<std::int64_t>(l.block_cols))};
  return out;
}

bool LayerState::scaled_bf16(TensorKind k, bool backward_form) const {
  if (ctx->compute == Compute::fp32 || !(backward_form || scaled(k)) || !bf16_products_available()) return false;
  const ScaledSpec& s = spec(k, backward_form);
  return s.element.format.man_bits <= 7 && (s.scale == ScaleFormat::e8m0 || s.scale == ScaleFormat::ue4m3) &&
         !s.dither_scale && !(s.tensor_scale && s.fold_tensor_scale);
}

torch::Tensor LayerState::operand_tensor(TensorKind k, const torch::Tensor& m, at::IntArrayRef shape,
                                         const MatrixView& v, bool for_products, OperandLayout layout,
                                         bool backward_form) const {
  if (m.scalar_type() == torch::kBFloat16 || (for_products && scaled_bf16(k, backward_form)))
    if (const std::optional<torch::Tensor> b = m.scalar_type() == torch::kBFloat16 ? m : exact_bf16(m)) {
      const bool views = layout == OperandLayout::any && scaled_bf16(TensorKind::a) && scaled_bf16(TensorKind::w) &&
                         scaled_bf16(TensorKind::gx) && !quant.a_bwd && !quant.w_bwd;
      return views ? matrix_as(*b, shape, v) : from_matrix(*b, shape, v);
    }
  return from_matrix(m, shape, v);
}

std::pair<ProductOperand, ProductOperand> LayerState::quantize_grad(torch::Tensor g, const MatrixView& for_dx,
                                                                    const MatrixView& for_dw, std::uint32_t call,
                                                                    std::int64_t refs, GradUse use) {
  if (!scaled(TensorKind::gx)) {
    if (use.for_products && bf16_codes(TensorKind::gx)) {  // no float32 copy: codes, then bfloat16
      torch::Tensor q = encode_for_products(TensorKind::gx, g, call, 0, false).first;
      return {{q}, {q}};
    }
    torch::Tensor q = quantize_owned(TensorKind::gx, std::move(g), call, refs);
    return {{q}, {q}};
  }
  const ScaledCall sc = amax.scaled_call(TensorKind::gx, 0);
  const bool bf16 = use.for_products && scaled_bf16(TensorKind::gx);
  const auto transform = [&](BackwardProduct p, TensorKind partner) {
    return use.hadamard && hadamard_applies(p, partner) ? p : BackwardProduct::none;
  };
  const bool apart = scales_apart(TensorKind::gx, use.scales_apart);
  const auto [dx, dw] = quantize_scaled_twice(
      TensorKind::gx, g, call, sc,
      {for_dx, 0,
       operand_outputs(apart, {.hadamard = transform(BackwardProduct::grad_x, use.dx_partner), .bf16 = bf16,
                               .operand = true})},
      {for_dw, 1,
       operand_outputs(apart, {.count = false, .hadamard = transform(BackwardProduct::grad_w, TensorKind::a),
                               .bf16 = bf16, .operand = true})});
  amax.push(TensorKind::gx, 0, dx.amax);
  const auto formed = [&](const ScaledTensor& q, const MatrixView& v) {
    if (apart) return apart_operand(TensorKind::gx, q, g.sizes(), v, use.for_products);
    return ProductOperand{
        operand_tensor(TensorKind::gx, q.bf16.defined() ? q.bf16 : q.values, g.sizes(), v, use.for_products, use.layout),
        q.output_factor()};
  };
  return {formed(dx, for_dx), formed(dw, for_dw)};
}

torch::Tensor LayerState::quantize_along(TensorKind k, torch::Tensor t, const MatrixView& v, std::uint32_t call) {
  if (!scaled(k)) return quantize_owned(k, std::move(t), call);
  const ScaledTensor q = quantize_scaled(k, t, v, call, 0, amax.scaled_call(k, 0));
  amax.push(k, 0, q.amax);
  return from_matrix(q.values, t.sizes(), v);
}

torch::Tensor LayerState::quantize(TensorKind k, const torch::Tensor& t, std::uint32_t call,
                                   std::uint32_t operand) {
  const KindQuant& q = quant[k];
  if (q && q->scaled()) {  // blocks along the last dimension
    const ScaledTensor s = quantize_scaled(k, t, {}, call, operand, amax.scaled_call(k, operand));
    amax.push(k, operand, s.amax);
    return from_matrix(s.values, t.sizes(), {});
  }
  QuantCounts c;
  torch::Tensor out;
  if (q) {
    out = fake_quantize(t, q->element, streams.seed_for(k, call, operand), &c);
  } else {
    out = t;
    c.total = static_cast<std::uint64_t>(t.numel());
  }
  stats.record(k, {t, c}, call);
  return out;
}

torch::Tensor LayerState::quantize_owned(TensorKind k, torch::Tensor t, std::uint32_t call,
                                        std::int64_t refs) {
  const KindQuant& q = quant[k];
  // In place only when the caller's handles are the only references to the tensor and
  // its storage (no view, no other node's input or saved tensor), and not on a statistics
  // step, whose histogram is of the values before quantization.
  const bool exclusive = t.defined() && t.use_count() <= refs && t.has_storage() &&
                         t.storage().use_count() == 1 &&
                         (t.is_contiguous() || (t.is_non_overlapping_and_dense() && q &&
                                                q->element.rounding != Rounding::stochastic)) &&
                         t.device().is_cpu() && t.scalar_type() == torch::kFloat32;
  if (!q || q->scaled() || !exclusive || stats.due(call)) return quantize(k, t, call);
  QuantCounts c;
  fake_quantize_(t, q->element, streams.seed_for(k, call), &c);
  stats.record(k, {t, c}, call);
  ++ctx->in_place;
  return t;
}

bool LayerState::bf16_codes(TensorKind k) const {
  const KindQuant& q = quant[k];
  return ctx->compute != Compute::fp32 && q && !q->scaled() && q->element.format.codable() &&
         q->element.format.width() <= 8 && exact_in_bf16(q->element.format) && bf16_products_available();
}

std::pair<torch::Tensor, torch::Tensor> LayerState::encode_for_products(TensorKind k, const torch::Tensor& t,
                                                                        std::uint32_t call, std::uint32_t operand,
                                                                        bool codes) {
  QuantCounts c;
  std::optional<BfQuantized> q =
      quantize_bf16_tensor(t, quant[k]->element, streams.seed_for(k, call, operand), codes, &c);
  if (!q) throw Error("layer '" + name + "': " + std::string(to_string(k)) + " values are not bfloat16 values");
  stats.record(k, {t, c}, call);
  return {q->values, q->codes};
}

std::pair<torch::Tensor, torch::Tensor> LayerState::quantize_and_save(TensorKind k, const torch::Tensor& t,
                                                                      std::uint32_t call, SaveAs how) {
  const KindQuant& q = quant[k];
  std::atomic<std::int64_t>& bytes = saved_bytes(k);
  if (how.for_products && bf16_codes(k) && saves_codes(k)) {
    auto [values, codes] = encode_for_products(k, t, call, how.operand, true);
    bytes += codes.numel();
    return {values, codes};
  }
  if (!q || q->scaled() || !saves_codes(k) || !q->element.format.codable()) {
    torch::Tensor y = quantize(k, t, call, how.operand);
    bytes += static_cast<std::int64_t>(y.numel()) * 4;
    return {y, y};
  }
  QuantCounts c;
  auto [y, codes] = quantize_and_encode_tensor(t, q->element, streams.seed_for(k, call, how.operand), &c);
  stats.record(k, {t, c}, call);
  bytes += static_cast<std::int64_t>(codes.numel() * codes.element_size());
  return {y, codes};
}

torch::Tensor LayerState::restore(TensorKind k, const torch::Tensor& saved) const {
  if (saved.scalar_type() == torch::kFloat32) return saved;
  return decode_tensor(saved, quant[k]->element.format);
}

torch::Tensor LayerState::restore_for_product(TensorKind k, const torch::Tensor& saved) const {
  if (saved.scalar_type() == torch::kUInt8 && bf16_codes(k))
    if (std::optional<torch::Tensor> b = decode_tensor_bf16(saved, quant[k]->element.format)) return *b;
  return restore(k, saved);
}


}  // namespace fp8lab::nn
