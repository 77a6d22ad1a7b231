#include "fp8lab/nn/loss_scale.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>

#include "fp8lab/core/enum_names.hpp"
#include "fp8lab/core/format.hpp"

namespace fp8lab::nn {

namespace {

constexpr EnumName<LossScaleMethod> kMethods[] = {{LossScaleMethod::none, "none"},
                                                  {LossScaleMethod::fixed, "static"},
                                                  {LossScaleMethod::backoff, "backoff"},
                                                  {LossScaleMethod::logmax, "logmax"}};
constexpr EnumName<LossScaleMethod> kMethodAliases[] = {{LossScaleMethod::fixed, "fixed"}};

}  // namespace

std::string_view to_string(LossScaleMethod m) { return enum_name(kMethods, m); }

LossScaleConfig parse_loss_scale(std::string_view text) {
  LossScaleConfig c;
  const std::string t(text);
  const std::size_t colon = t.find(':');
  const std::string method = t.substr(0, colon);
  const std::string rest = colon == std::string::npos ? "" : t.substr(colon + 1);
  auto bad = [&](const std::string& why) { return Error("loss scaling '" + t + "': " + why); };
  const auto m = enum_find(kMethods, method, kMethodAliases);
  if (!m) throw bad("unknown method '" + method + "' (expected " + enum_names(kMethods) + ")");
  c.method = *m;
  if (c.method == LossScaleMethod::backoff) c.init_log2 = 16;
  auto num = [&](const std::string& key, const std::string& v) {
    char* end = nullptr;
    const double d = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0' || !std::isfinite(d)) throw bad("'" + key + "' needs a number, got '" + v + "'");
    return d;
  };
  // An integer in [lo, hi]: a log2 scale outside float32's exponent range, or a fraction,
  // is an error rather than a silently converted value.
  auto integer = [&](const std::string& key, const std::string& v, int lo, int hi) {
    const double d = num(key, v);
    if (d != std::floor(d) || d < lo || d > hi)
      throw bad("'" + key + "' must be an integer in " + std::to_string(lo) + ".." + std::to_string(hi) + ", got '" +
                v + "'");
    return static_cast<int>(d);
  };
  constexpr int kLog2Lo = -126, kLog2Hi = 127;  // scales that are normal float32 numbers
  std::size_t pos = 0;
  while (pos < rest.size()) {
    std::size_t comma = rest.find(',', pos);
    if (comma == std::string::npos) comma = rest.size();
    const std::string item = rest.substr(pos, comma - pos);
    pos = comma + 1;
    if (item.empty()) continue;
    const std::size_t eq = item.find('=');
    if (eq == std::string::npos) {
      // "static:22" is the log2 of the scale.
      if (c.method == LossScaleMethod::fixed) {
        c.init_log2 = integer("log2 scale", item, kLog2Lo, kLog2Hi);
        continue;
      }
      throw bad("'" + item + "' is not key=value");
    }
    const std::string key = item.substr(0, eq), v = item.substr(eq + 1);
    if (key == "init") c.init_log2 = integer(key, v, kLog2Lo, kLog2Hi);
    else if (key == "interval" && c.method == LossScaleMethod::backoff) c.interval = integer(key, v, 1, 1000000000);
    else if (key == "factor" && c.method == LossScaleMethod::backoff) {
      const double f = num(key, v);
      const double l = std::log2(f);
      if (f < 2 || l != std::floor(l) || l > 64) throw bad("factor must be a power of two in 2..2^64");
      c.backoff_log2_factor = static_cast<int>(l);
    } else if (key == "c" && c.method == LossScaleMethod::logmax) c.c = num(key, v);
    else if (key == "beta1" && c.method == LossScaleMethod::logmax) c.beta1 = num(key, v);
    else if (key == "beta2" && c.method == LossScaleMethod::logmax) c.beta2 = num(key, v);
    else if (key == "max" && c.method == LossScaleMethod::logmax) c.grad_format_max = num(key, v);
    else if (key == "min_log2") c.min_log2 = integer(key, v, kLog2Lo, kLog2Hi);
    else if (key == "max_log2") c.max_log2 = integer(key, v, kLog2Lo, kLog2Hi);
    else throw bad("unknown key '" + key + "' for " + method);
  }
  if (c.interval < 1) throw bad("interval must be >= 1");
  if (c.beta1 <= 0 || c.beta1 >= 1 || c.beta2 <= 0 || c.beta2 >= 1) throw bad("betas must be in (0, 1)");
  if (c.min_log2 > c.max_log2) throw bad("min_log2 > max_log2");
  if (c.init_log2 < c.min_log2 || c.init_log2 > c.max_log2)
    throw bad("the initial log2 scale " + std::to_string(c.init_log2) + " is outside min_log2..max_log2 (" +
              std::to_string(c.min_log2) + ".." + std::to_string(c.max_log2) + ")");
  if (c.method == LossScaleMethod::logmax && !(c.grad_format_max > 0)) throw bad("'max' must be > 0");
  return c;
}

std::string to_string(const LossScaleConfig& c) {
  std::string s(to_string(c.method));
  switch (c.method) {
    case LossScaleMethod::none: break;
    case LossScaleMethod::fixed: s += ":" + std::to_string(c.init_log2); break;
    case LossScaleMethod::backoff:
      s += ":init=" + std::to_string(c.init_log2) + ",interval=" + std::to_string(c.interval);
      break;
    case LossScaleMethod::logmax: {
      char buf[64];
      std::snprintf(buf, sizeof buf, ":c=%g,init=%d", c.c, c.init_log2);
      s += buf;
      break;
    }
  }
  return s;
}

LossScaler::LossScaler(LossScaleConfig cfg) : cfg_(cfg) {
  set_log2(cfg_.method == LossScaleMethod::none ? 0 : cfg_.init_log2);
}

void LossScaler::set_log2(int k) { log2_ = std::clamp(k, cfg_.min_log2, cfg_.max_log2); }

double LossScaler::scale() const { return std::ldexp(1.0, log2_); }

std::vector<double> LossScaler::state() const {
  return {static_cast<double>(log2_), static_cast<double>(clean_), static_cast<double>(skipped_),
          static_cast<double>(steps_), ema1_, ema_x_, ema_x2_, corr1_, corr2_};
}

void LossScaler::set_state(const std::vector<double>& s) {
  if (s.size() != 9) throw Error("loss scaler state: expected 9 numbers, got " + std::to_string(s.size()));
  log2_ = static_cast<int>(s[0]);
  clean_ = static_cast<std::uint64_t>(s[1]);
  skipped_ = static_cast<std::uint64_t>(s[2]);
  steps_ = static_cast<std::uint64_t>(s[3]);
  ema1_ = s[4], ema_x_ = s[5], ema_x2_ = s[6], corr1_ = s[7], corr2_ = s[8];
}

double LossScaler::mu() const { return corr1_ < 1 ? ema1_ / (1 - corr1_) : 0; }
double LossScaler::sigma() const {
  if (corr2_ >= 1) return 0;
  const double m = ema_x_ / (1 - corr2_), m2 = ema_x2_ / (1 - corr2_);
  return std::sqrt(std::max(0.0, m2 - m * m));
}

LossScaleStep LossScaler::update_from(double l, bool overflow) {
  LossScaleStep s;
  s.scale = scale();
  s.overflow = overflow;
  s.log2_max_grad = l;
  ++steps_;
  switch (cfg_.method) {
    case LossScaleMethod::none:
    case LossScaleMethod::fixed:
      s.skipped = false;  // no recovery: a NaN reaches the optimizer (and the run diverges)
      break;
    case LossScaleMethod::backoff:
      if (overflow) {
        s.skipped = true;
        clean_ = 0;
        set_log2(log2_ - cfg_.backoff_log2_factor);
      } else if (++clean_ >= static_cast<std::uint64_t>(cfg_.interval)) {
        clean_ = 0;
        set_log2(log2_ + cfg_.backoff_log2_factor);
      }
      break;
    case LossScaleMethod::logmax:
      if (overflow) {
        // Gradients saturate under LogMax, so a NaN/Inf is a real overflow: skip and back off.
        s.skipped = true;
        set_log2(log2_ - 1);
        break;
      }
      if (std::isfinite(l)) {
        ema1_ = cfg_.beta1 * ema1_ + (1 - cfg_.beta1) * l;
        corr1_ *= cfg_.beta1;
        ema_x_ = cfg_.beta2 * ema_x_ + (1 - cfg_.beta2) * l;
        ema_x2_ = cfg_.beta2 * ema_x2_ + (1 - cfg_.beta2) * l * l;
        corr2_ *= cfg_.beta2;
        const double k = std::floor(std::log2(cfg_.grad_format_max) - (mu() + cfg_.c * sigma()));
        set_log2(static_cast<int>(std::clamp(k, -1e6, 1e6)));
      }
      break;
  }
  if (s.skipped) ++skipped_;
  return s;
}

LossScaleStep LossScaler::update(const std::vector<torch::Tensor>& grads) {
  torch::NoGradGuard no_grad;
  const double alpha = scale();
  bool overflow = false;
  double maxabs = 0;
  for (const auto& g : grads) {
    if (!g.defined() || g.numel() == 0) continue;
    const double m = g.abs().max().item<double>();  // NaN propagates through max
    if (!std::isfinite(m)) overflow = true;
    else maxabs = std::max(maxabs, m);
  }
  if (alpha != 1.0)
    for (const auto& g : grads)
      if (g.defined()) const_cast<torch::Tensor&>(g).div_(alpha);
  const double l = maxabs > 0 ? std::log2(maxabs / alpha) : -std::numeric_limits<double>::infinity();
  return update_from(l, overflow);
}

LossScaleConfig with_recipe_target(LossScaleConfig c, const Recipe& recipe) {
  const auto& g = recipe.base[TensorKind::gx];
  if (c.method == LossScaleMethod::logmax && g && !g->scaled()) c.grad_format_max = g->element.format.max_finite();
  return c;
}

bool backoff_blind_to_overflow(const LossScaleConfig& c, const Recipe& recipe) {
  const auto& g = recipe.base[TensorKind::gx];
  return c.method == LossScaleMethod::backoff && g && !g->scaled() && g->element.overflow == Overflow::saturate;
}

}  // namespace fp8lab::nn
