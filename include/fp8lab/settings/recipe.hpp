// Recipes (docs/spec.md §4): a quantizer (or float32) for each of the four tensor kinds of every
// matmul and convolution, plus overrides for layers chosen by module path.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fp8lab/core/format.hpp"
#include "fp8lab/core/scaled.hpp"
#include "fp8lab/settings/compute_spec.hpp"

namespace fp8lab::nn {

// activations, weights, gradient w.r.t. activations (grad_x), gradient w.r.t. weights
enum class TensorKind : std::uint8_t { a = 0, w = 1, gx = 2, gw = 3 };
inline constexpr int kKinds = 4;
inline constexpr std::array<TensorKind, 4> kAllKinds = {TensorKind::a, TensorKind::w,
                                                         TensorKind::gx, TensorKind::gw};
std::string_view to_string(TensorKind k);  // "a", "w", "gx", "gw"
std::string_view kind_title(TensorKind k);  // "activations", "weights", "grad_x", "grad_w"
TensorKind parse_kind(std::string_view s);  // also "activations", "weights", "grad_x", "grad_w"

// nullopt: the tensor stays float32. A fixed-bias spec (scale none) is the paper's quantizer;
// a scaled one quantizes each operand of a product in blocks along the product's reduction
// dimension (docs/spec.md §6.6).
using KindQuant = std::optional<ScaledSpec>;

// "fp32" | QUANTIZER[/ROUNDING[:RANDOM_BITS]][/OVERFLOW], QUANTIZER a format or a scaled
// format (docs/spec.md §6.4), e.g. "1.5.2:33/stochastic/nan", "1.5.2:33/stochastic:12"
// (stochastic rounding on 12 random bits instead of 32), "mxfp8_e4m3", "nvfp4/stochastic".
KindQuant parse_kind_quant(std::string_view text);
std::string to_string(const KindQuant& q);

// The signs s of the Hadamard transform H (s * v) / 4 (docs/spec.md §6.6): random, drawn for
// each product from the layer's stream; none, every sign +1 (the plain transform); te,
// TransformerEngine's 16 fixed signs (its reference NVFP4 quantizer's).
enum class HadamardSigns : std::uint8_t { random, none, te };
std::string_view to_string(HadamardSigns s);
HadamardSigns parse_hadamard_signs(std::string_view s);  // throws Error naming the choices
// The fixed signs of `none` and `te` (random has none: its signs depend on the call).
const std::array<float, 16>& fixed_hadamard_signs(HadamardSigns s);

// The products whose operands the Hadamard transform goes on (docs/spec.md §6.6): grad_w's
// (NVIDIA's NVFP4 recipe), or both backward products, grad_x's too (Tseng et al.'s MXFP4
// recipe, Quartet II).
enum class HadamardProducts : std::uint8_t { grad_w, backward };
std::string_view to_string(HadamardProducts p);
HadamardProducts parse_hadamard_products(std::string_view s);  // throws Error naming the choices
// What a backward form quantizes (docs/spec.md §6.12): the float32 tensor itself, or the
// values the forward product read, Q(t) (Quartet II requantizes those).
enum class BackwardSource : std::uint8_t { tensor, forward };
std::string_view to_string(BackwardSource s);
BackwardSource parse_backward_source(std::string_view s);  // throws Error naming the choices
// The transform's sizes: 16, 32, 64 and 128 (0: none).
inline bool is_hadamard_size(int n) { return n == 16 || n == 32 || n == 64 || n == 128; }

struct LayerQuant {
  std::array<KindQuant, kKinds> q{};
  // 16, 32, 64 or 128: the random Hadamard transform of that size on both operands of the
  // products `hadamard_on` names, in linear layers and matmuls whose quantizers of both
  // operands are scaled (docs/spec.md §6.6); 0: none.
  int hadamard = 0;
  HadamardSigns hadamard_signs = HadamardSigns::random;
  HadamardProducts hadamard_on = HadamardProducts::grad_w;
  // The backward forms of a and w (docs/spec.md §6.12): where engaged, the backward product
  // takes its operand quantized by this scaled quantizer from the float32 tensor, while the
  // forward product takes q[a] / q[w]'s (Tseng et al.'s MXFP4 recipe: a bfloat16 forward,
  // MXFP4 backward products). nullopt: the backward product takes the kind's own quantizer.
  KindQuant a_bwd, w_bwd;
  BackwardSource bwd_from = BackwardSource::tensor;
  // The backward form of kind k (a_bwd for a, w_bwd for w; nullopt for the gradients).
  const KindQuant& backward_form(TensorKind k) const {
    static const KindQuant none;
    return k == TensorKind::a ? a_bwd : k == TensorKind::w ? w_bwd : none;
  }
  KindQuant& operator[](TensorKind k) { return q[static_cast<int>(k)]; }
  const KindQuant& operator[](TensorKind k) const { return q[static_cast<int>(k)]; }
  friend bool operator==(const LayerQuant&, const LayerQuant&) = default;
};

struct RecipeOverride {
  // Glob over the module path ('*' any run of characters, '?' one), or "first" / "last"
  // (the first or last quantized layer in model order).
  std::string pattern;
  std::array<std::optional<KindQuant>, kKinds> set{};  // engaged: replaces the base value
  friend bool operator==(const RecipeOverride&, const RecipeOverride&) = default;
};

struct Recipe {
  std::string name;
  LayerQuant base;
  std::vector<RecipeOverride> overrides;
  // The paper keeps the first layer's input and the gradient at its output in float32
  // (ResNets, Transformers) or in float16 (EfficientNets): exempt_first, and the quantizer
  // those two tensors take instead (nullopt: float32).
  bool exempt_first = true;
  KindQuant first_quant;
  // The first quantized layer entirely in keep_first_quant (nullopt: float32), all four
  // tensor kinds (NVIDIA's NVFP4 recipe keeps it in bfloat16).
  bool keep_first = false;
  KindQuant keep_first_quant;
  // The last quantized layer (a classifier, a language-model head) entirely in
  // keep_last_quant (nullopt: float32).
  bool keep_last = false;
  KindQuant keep_last_quant;
  int hadamard = 0;  // 0, 16, 32, 64 or 128: LayerQuant::hadamard of every layer
  HadamardSigns hadamard_signs = HadamardSigns::random;  // LayerQuant::hadamard_signs of every layer
  HadamardProducts hadamard_on = HadamardProducts::grad_w;  // LayerQuant::hadamard_on of every layer
  // The recipe's `compute` and `accumulate` (docs/spec.md §7); nullopt where it leaves them
  // to the run's config (quant.compute, quant.accumulate).
  std::optional<Compute> compute;
  std::optional<Accumulation> accumulate;

  // The quantizers of layer `index` of `count` with module path `path`: the base, the
  // first-layer exemption, keep_first, keep_last, then every matching override in order.
  // A layer whose a (or w) quantizer is not the base's (exempted, kept or overridden) has no
  // backward form of a (or w): its backward product takes that quantizer too.
  LayerQuant resolve(std::string_view path, int index, int count) const;
  // Whether resolve() needs the count of layers: keep_last, or an override of `last`.
  bool depends_on_count() const;
  // The one-line form of everything but the name; parse_recipe(to_line()) equals this
  // recipe but for its name. Throws Error for a recipe with overrides (only TOML holds them).
  std::string to_line() const;
  // The TOML form of everything: parse_recipe_toml(to_toml()) == *this.
  std::string to_toml() const;
  friend bool operator==(const Recipe&, const Recipe&) = default;
};

// One grammar, two forms (docs/spec.md §4.2). The keys: name; a, w, gx, gw (a quantizer:
// "fp32" | QUANTIZER[/ROUNDING[:RANDOM_BITS]][/OVERFLOW], or in TOML a table with format,
// rounding, overflow, random_bits); exempt_first (true, false or the quantizer the first
// layer's input and output gradient take instead of float32, e.g. "fp16"); keep_first and
// keep_last (true, false, or the quantizer of the whole first or last layer, e.g. "bf16");
// hadamard (0, 16, 32, 64 or 128); hadamard_signs (random, none, te); hadamard_on (grad_w,
// backward); a_bwd and w_bwd (a scaled quantizer with current scaling); compute (fp32, bf16, auto); accumulate
// (fp32, FORMAT@CHUNK or a dot model).
//
// The line: "a=1.4.3:10,w=1.4.3:14,gx=1.5.2:33,gw=1.5.2:31" (kinds not named stay
// float32), the same keys as KEY=VALUE items, with `first` another name of exempt_first and
// `last` of keep_last (`last=fp32`: the last layer in float32), or a preset name, which
// KEY=VALUE items after it change ("nvfp4-training,hadamard=0"). Per-layer overrides are
// TOML's alone; a line refuses them, pointing at TOML.
Recipe parse_recipe(std::string_view text);
// TOML: the keys at the top level or in a [recipe] table, and [[override]] tables with
// `match` and any of a, w, gx, gw. Errors name the source, line and key.
Recipe parse_recipe_toml(std::string_view toml, const std::string& source = "recipe");
Recipe load_recipe(const std::string& path_or_line);  // a .toml file, a preset or a line
// A recipe from its keys' values as text (a bool as "true"/"false"), as a line would give
// them, and overrides given as (match, {kind: quantizer}) pairs: what Python's
// Recipe(a=..., gx=..., overrides=[...]) builds. Errors name the key.
Recipe recipe_from_fields(const std::vector<std::pair<std::string, std::string>>& fields,
                          const std::vector<std::pair<std::string, std::vector<std::pair<std::string, std::string>>>>&
                              overrides = {});

struct RecipePreset {
  std::string_view name, line, note;
};
const std::vector<RecipePreset>& recipe_presets();

bool glob_match(std::string_view pattern, std::string_view text);
// Throws Error naming every override pattern that matches none of `paths`.
void check_overrides(const Recipe& r, const std::vector<std::string>& paths);

}  // namespace fp8lab::nn
