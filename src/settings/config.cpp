#include "fp8lab/core/toml_parse.hpp"
#include "fp8lab/core/text.hpp"
#include "fp8lab/settings/config.hpp"


#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <regex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <variant>

#include "fp8lab/core/files.hpp"
#include "fp8lab/core/error.hpp"
#include "fp8lab/core/machine.hpp"

namespace fp8lab::settings {

namespace {

using FieldPtr = std::variant<std::string*, int*, std::int64_t*, std::uint64_t*, double*, bool*, std::vector<double>*,
                              std::optional<nn::Compute>*, std::optional<nn::Accumulation>*, Spelled<nn::Recipe>*,
                              Spelled<nn::LossScaleConfig>*, Spelled<nn::KindQuant>*>;
struct Field {
  std::string key;  // dotted: "train.epochs"
  FieldPtr ptr;
};

// A quantization setting parsed from its text that may be left unset (std::optional<T>:
// unset, or its value), and one that keeps its text beside its value (Spelled<T>).
template <class T>
inline constexpr bool kIsSetting = false;
template <class T>
inline constexpr bool kIsSetting<std::optional<T>> = true;
template <class T>
inline constexpr bool kIsSpelled = false;
template <class T>
inline constexpr bool kIsSpelled<Spelled<T>> = true;

// The settings' parsers, errors without the key (the callers add it).
nn::KindQuant grad_comm_value(const std::string& text) {
  const nn::KindQuant comm = nn::parse_kind_quant(text);
  if (comm && comm->history > 0) throw Error("delayed scaling has no history to draw on here; use current scaling");
  if (comm && comm->element.format.width() > 16)
    throw Error("'" + text + "' has " + std::to_string(comm->element.format.width()) +
                " bits; gradients travel in formats of at most 16 bits (or fp32)");
  return comm;
}
void parse_setting(Spelled<nn::Recipe>& s, const std::string& text) { s = {text, nn::load_recipe(text)}; }
void parse_setting(Spelled<nn::LossScaleConfig>& s, const std::string& text) { s = {text, nn::parse_loss_scale(text)}; }
void parse_setting(Spelled<nn::KindQuant>& s, const std::string& text) { s = {text, grad_comm_value(text)}; }

template <class T>
Spelled<T> setting(const std::string& key, const std::string& text) {
  Spelled<T> s;
  try {
    parse_setting(s, text);
  } catch (const Error& e) {
    throw Error("config: " + key + ": " + e.what());
  }
  return s;
}

// Every field of the config, in the order to_toml writes them: the one table that parsing,
// --set, TOML and JSON output share.
std::vector<Field> fields(TrainConfig& c) {
  return {
      {"name", &c.name},
      {"task", &c.task},
      {"seed", &c.seed},
      {"threads", &c.threads},
      {"model.name", &c.model.name},
      {"model.width", &c.model.width},
      {"model.width_mult", &c.model.width_mult},
      {"model.depth_mult", &c.model.depth_mult},
      {"model.bn_momentum", &c.model.bn_momentum},
      {"model.dropout", &c.model.dropout},
      {"model.channels_last", &c.model.channels_last},
      {"data.name", &c.data.name},
      {"data.dir", &c.data.dir},
      {"data.train_limit", &c.data.train_limit},
      {"data.test_limit", &c.data.test_limit},
      {"data.augment", &c.data.augment},
      {"data.image_size", &c.data.image_size},
      {"data.synthetic_train", &c.data.synthetic_train},
      {"data.synthetic_test", &c.data.synthetic_test},
      {"data.synthetic_classes", &c.data.synthetic_classes},
      {"data.synthetic_channels", &c.data.synthetic_channels},
      {"data.src_lang", &c.data.src_lang},
      {"data.tgt_lang", &c.data.tgt_lang},
      {"data.vocab_size", &c.data.vocab_size},
      {"data.max_tokens", &c.data.max_tokens},
      {"data.drop_long", &c.data.drop_long},
      {"optimizer.name", &c.optimizer.name},
      {"optimizer.lr", &c.optimizer.lr},
      {"optimizer.momentum", &c.optimizer.momentum},
      {"optimizer.nesterov", &c.optimizer.nesterov},
      {"optimizer.weight_decay", &c.optimizer.weight_decay},
      {"optimizer.beta1", &c.optimizer.beta1},
      {"optimizer.beta2", &c.optimizer.beta2},
      {"optimizer.eps", &c.optimizer.eps},
      {"optimizer.alpha", &c.optimizer.alpha},
      {"schedule.name", &c.schedule.name},
      {"schedule.decay_at", &c.schedule.decay_at},
      {"schedule.factor", &c.schedule.factor},
      {"schedule.warmup_steps", &c.schedule.warmup_steps},
      {"schedule.gamma", &c.schedule.gamma},
      {"schedule.every_epochs", &c.schedule.every_epochs},
      {"train.epochs", &c.train.epochs},
      {"train.steps", &c.train.steps},
      {"train.batch", &c.train.batch},
      {"train.micro_batches", &c.train.micro_batches},
      {"train.label_smoothing", &c.train.label_smoothing},
      {"train.mixup", &c.train.mixup},
      {"train.cutmix", &c.train.cutmix},
      {"train.ema", &c.train.ema},
      {"train.average_last", &c.train.average_last},
      {"train.eval_interval", &c.train.eval_interval},
      {"train.stats_interval", &c.train.stats_interval},
      {"train.checkpoint_interval", &c.train.checkpoint_interval},
      {"train.checkpoint", &c.train.checkpoint},
      {"train.beam", &c.train.beam},
      {"train.bleu_lowercase", &c.train.bleu_lowercase},
      {"train.flush_denormals", &c.train.flush_denormals},
      {"quant.recipe", &c.quant.recipe},
      {"quant.loss_scale", &c.quant.loss_scale},
      {"quant.compute", &c.quant.compute},
      {"quant.accumulate", &c.quant.accumulate},
      {"quant.grad_comm", &c.quant.grad_comm},
  };
}

const std::vector<std::string> kSections = {"model", "data", "optimizer", "schedule", "train", "quant"};

std::string known_keys(const std::string& section) {
  TrainConfig c;
  std::string s;
  for (const auto& f : fields(c)) {
    const auto dot = f.key.find('.');
    const std::string sec = dot == std::string::npos ? "" : f.key.substr(0, dot);
    if (sec == section) s += (s.empty() ? "" : ", ") + (dot == std::string::npos ? f.key : f.key.substr(dot + 1));
  }
  if (section.empty())
    for (const auto& t : kSections) s += ", [" + t + "]";
  return s;
}

// Names, paths, recipes and schedules: UTF-8 without control characters (a NUL would cut a
// path short; a DEL cannot be written back into TOML unescaped) and without the plane-15
// private-use characters that the TOML reader reserves (a config must read back).
bool plain_text(const std::string& s) {
  for (std::size_t i = 0; i < s.size();) {
    const auto ch = utf8_at(s, i);
    if (!ch || ch->code_point < 0x20 || ch->code_point == 0x7F || reserved_by_toml_shield(ch->code_point))
      return false;
    i += ch->size;
  }
  return true;
}

// What a number that TOML could not hold is: a `--set` value that is not valid TOML
// arrives as a string, and "99999999999999999999" or "1e999" is a number out of range,
// not text of the wrong type.
std::string number_problem(const toml::node& v, bool integer) {
  const auto s = v.value_exact<std::string>();
  static const std::regex int_form(R"([+-]?[0-9][0-9_]*)");
  static const std::regex float_form(R"([+-]?([0-9][0-9_]*)?(\.[0-9_]+)?([eE][+-]?[0-9]+)?)");
  if (s && std::regex_match(*s, int_form))
    return "is out of range (" + *s + " does not fit a 64-bit integer)";
  if (s && !s->empty() && std::regex_match(*s, float_form) && s->find_first_of("0123456789") != std::string::npos)
    return integer ? "must be an integer" : "is out of range (" + *s + " is not a finite number)";
  return integer ? "must be an integer" : "must be a number";
}

// Assigns a TOML value to a field; throws Error (without location) on a type mismatch.
void assign(const Field& f, const toml::node& v) {
  std::visit(
      [&](auto* p) {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, std::string> || kIsSpelled<T>) {
          const auto s = v.value_exact<std::string>();
          if (!s) throw Error("must be a string");
          if (!plain_text(*s)) throw Error("must be UTF-8 text without control characters or plane-15 private-use characters");
          if constexpr (kIsSpelled<T>) {
            try {
              parse_setting(*p, *s);
            } catch (const Error& e) {
              throw Error(std::string("is not valid: ") + e.what());
            }
          } else {
            *p = *s;
          }
        } else if constexpr (std::is_same_v<T, std::optional<nn::Compute>>) {
          const auto s = v.value_exact<std::string>();
          if (!s) throw Error("must be a string (fp32, bf16 or auto)");
          *p = nn::parse_compute(*s);
        } else if constexpr (std::is_same_v<T, std::optional<nn::Accumulation>>) {
          const auto s = v.value_exact<std::string>();
          if (!s) throw Error("must be a string (fp32, FORMAT@CHUNK or a dot model)");
          *p = nn::parse_accumulation(*s);
        } else if constexpr (std::is_same_v<T, bool>) {
          if (auto b = v.value_exact<bool>()) *p = *b;
          else throw Error("must be true or false");
        } else if constexpr (std::is_same_v<T, double>) {
          if (auto d = v.value<double>()) *p = *d;
          else throw Error(number_problem(v, false));
        } else if constexpr (std::is_same_v<T, std::vector<double>>) {
          const auto* arr = v.as_array();
          if (!arr) throw Error("must be an array of numbers");
          std::vector<double> out;
          for (auto&& e : *arr) {
            if (auto d = e.value<double>()) out.push_back(*d);
            else throw Error("must be an array of numbers");
          }
          *p = out;
        } else {
          const auto i = v.value_exact<std::int64_t>();
          if (!i) throw Error(number_problem(v, true));
          if constexpr (std::is_same_v<T, int>) {
            if (*i < -(1LL << 31) || *i >= (1LL << 31)) throw Error("is out of range");
          }
          if constexpr (std::is_same_v<T, std::uint64_t>) {
            if (*i < 0) throw Error("must be >= 0");
          }
          *p = static_cast<T>(*i);
        }
      },
      f.ptr);
}

// Whether the field's TOML value is a string (text, or a setting parsed from text).
bool takes_text(const Field& f) {
  return std::visit(
      [](auto* p) {
        using T = std::remove_pointer_t<decltype(p)>;
        return std::is_same_v<T, std::string> || kIsSetting<T> || kIsSpelled<T>;
      },
      f.ptr);
}

// Whether the field is a setting left unset (written neither to TOML nor to JSON).
bool unset_setting(const Field& f) {
  return std::visit(
      [](auto* p) {
        if constexpr (kIsSetting<std::remove_pointer_t<decltype(p)>>) return !p->has_value();
        else return false;
      },
      f.ptr);
}

// A set setting's text as the config writes it.
template <class T>
std::string setting_text(const std::optional<T>& v) {
  return std::string(nn::to_string(*v));
}

Field* find_field(std::vector<Field>& fs, const std::string& key) {
  for (auto& f : fs)
    if (f.key == key) return &f;
  return nullptr;
}

std::string line_of(const std::string& source, const toml::node& n) {
  return at_line(source, n.source().begin.line);
}

void check(bool ok, const std::string& what) {
  if (!ok) throw Error("config: " + what);
}

// Every floating-point field is a finite number (inf and nan parse as TOML floats).
void check_finite(const TrainConfig& c) {
  TrainConfig copy = c;
  for (const auto& f : fields(copy)) {
    if (const auto* d = std::get_if<double*>(&f.ptr)) check(std::isfinite(**d), f.key + " must be a finite number");
    if (const auto* v = std::get_if<std::vector<double>*>(&f.ptr))
      for (double x : **v) check(std::isfinite(x), f.key + " must hold finite numbers");
  }
}

}  // namespace

Spelled<nn::Recipe> recipe_setting(const std::string& text) { return setting<nn::Recipe>("quant.recipe", text); }
Spelled<nn::LossScaleConfig> loss_scale_setting(const std::string& text) {
  return setting<nn::LossScaleConfig>("quant.loss_scale", text);
}
Spelled<nn::KindQuant> grad_comm_setting(const std::string& text) {
  return setting<nn::KindQuant>("quant.grad_comm", text);
}

void adopt_recipe_settings(TrainConfig& c) {
  const nn::Recipe& r = c.quant.recipe.value;
  if (!c.quant.compute) c.quant.compute = r.compute.value_or(nn::Compute::fp32);
  if (!c.quant.accumulate) c.quant.accumulate = r.accumulate.value_or(nn::Accumulation{});
}

void complete_settings(TrainConfig& c) {
  adopt_recipe_settings(c);
  check_ranges(c);
}

void check_ranges(const TrainConfig& c) {
  try {
    check_file_name(c.name, "name");  // the default checkpoint is <name>.ckpt
  } catch (const Error& e) {
    throw Error(std::string("config: ") + e.what());
  }
  check_finite(c);
  check(c.threads >= 0 && c.threads <= kMaxThreads, "threads must be in 0.." + std::to_string(kMaxThreads) + " (0: all cores)");
  check(c.model.width >= 0 && c.model.width <= 4096, "model.width must be in 0..4096");
  check(c.model.width_mult >= 0 && c.model.depth_mult >= 0, "model multipliers must be >= 0");
  check(c.model.bn_momentum >= 0 && c.model.bn_momentum <= 1, "model.bn_momentum must be in 0..1 (0: the preset's)");
  check(c.model.dropout < 1, "model.dropout must be < 1");
  check(c.data.train_limit >= 0 && c.data.test_limit >= 0, "data limits must be >= 0");
  check(c.data.image_size >= 0 && c.data.image_size <= 1024, "data.image_size must be in 0..1024");
  check(c.data.synthetic_train > 0 && c.data.synthetic_test > 0 && c.data.synthetic_train <= (1 << 24) &&
            c.data.synthetic_test <= (1 << 24),
        "data.synthetic_train and data.synthetic_test must be in 1..2^24");
  check(c.data.synthetic_classes >= 2 && c.data.synthetic_classes <= 100000, "data.synthetic_classes must be in 2..100000");
  check(c.data.synthetic_channels >= 1 && c.data.synthetic_channels <= 1024, "data.synthetic_channels must be in 1..1024");
  const auto& o = c.optimizer;
  // Upper bounds far above any setting that trains, low enough that no product of them
  // overflows (a learning rate of 1e300 times a gradient is Inf before the first step).
  check(o.lr > 0 && o.lr <= 1e6, "optimizer.lr must be in (0, 1e6]");
  check(o.momentum >= 0 && o.momentum < 1, "optimizer.momentum must be in [0, 1)");
  check(o.weight_decay >= 0 && o.weight_decay <= 1e6, "optimizer.weight_decay must be in [0, 1e6]");
  check(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1, "optimizer betas must be in [0, 1)");
  check(o.eps > 0 && o.eps <= 1 && o.alpha > 0 && o.alpha < 1, "optimizer.eps must be in (0, 1], alpha in (0, 1)");
  const auto& s = c.schedule;
  for (double f : s.decay_at) check(f > 0 && f < 1, "schedule.decay_at fractions must be in (0, 1)");
  check(s.factor > 0 && s.gamma > 0 && s.every_epochs > 0 && s.factor <= 1e6 && s.gamma <= 1e6 &&
            s.every_epochs <= 1e6,
        "schedule factor, gamma, every_epochs must be in (0, 1e6]");
  constexpr std::int64_t kMaxSteps = 1'000'000'000'000;
  check(s.warmup_steps >= 0 && s.warmup_steps <= kMaxSteps, "schedule.warmup_steps must be in 0..10^12");
  const auto& t = c.train;
  check(t.epochs >= 1 || t.steps > 0, "train.epochs must be >= 1 (or train.steps > 0)");
  check(t.epochs <= 1'000'000, "train.epochs must be at most 10^6");
  check(t.steps >= 0 && t.steps <= kMaxSteps, "train.steps must be in 0..10^12");
  check(t.batch >= 1 && t.batch <= (1 << 24), "train.batch must be in 1..2^24");
  check(t.micro_batches >= 1 && t.micro_batches <= t.batch,
        "train.micro_batches must be in 1..train.batch (" + std::to_string(t.batch) + ")");
  check(t.label_smoothing >= 0 && t.label_smoothing < 1, "train.label_smoothing must be in [0, 1)");
  check(t.mixup >= 0 && t.cutmix >= 0 && t.mixup <= 1e6 && t.cutmix <= 1e6,
        "train.mixup and train.cutmix must be in [0, 1e6]");
  check(t.ema >= 0 && t.ema < 1, "train.ema must be in [0, 1)");
  check(t.average_last >= 0 && t.average_last <= 100, "train.average_last must be in 0..100");
  check(t.eval_interval >= 0 && t.stats_interval >= 0 && t.checkpoint_interval >= 0 && t.eval_interval <= kMaxSteps &&
            t.checkpoint_interval <= kMaxSteps,
        "intervals must be in 0..10^12");
}

TrainConfig read_train_config(const std::string& text, const std::string& source,
                              const std::vector<std::string>& overrides, bool require_schema) {
  const toml::table root = parse_toml(text, source);
  TrainConfig c;
  std::vector<Field> fs = fields(c);
  auto set_from = [&](const std::string& key, const toml::node& v, const std::string& where) {
    Field* f = find_field(fs, key);
    if (!f) {
      const auto dot = key.find('.');
      const std::string sec = dot == std::string::npos ? "" : key.substr(0, dot);
      if (!sec.empty() && std::find(kSections.begin(), kSections.end(), sec) == kSections.end())
        throw Error(where + "unknown section '" + sec + "' (expected model, data, optimizer, schedule, train, quant)");
      throw Error(where + "unknown key '" + key + "' (known" + (sec.empty() ? "" : " in [" + sec + "]") +
                  ": " + known_keys(sec) + ")");
    }
    try {
      assign(*f, v);
    } catch (const Error& e) {
      throw Error(where + "'" + key + "' " + e.what());
    }
  };
  if (require_schema && !root.contains("schema"))
    throw Error(source + ": not an fp8lab config: it has no 'schema = " + std::to_string(kConfigSchema) +
                "' line (`fp8lab train --print-config` prints a complete config)");
  for (auto&& [k, v] : root) {
    const std::string key(k.str());
    if (key == "schema") {
      const auto s = v.value_exact<std::int64_t>();
      if (!s || *s > kConfigSchema)
        throw Error(line_of(source, v) + "config schema " + (s ? std::to_string(*s) : "?") +
                    " is newer than this fp8lab reads (" + std::to_string(kConfigSchema) + ")");
      continue;
    }
    if (const auto* t = v.as_table()) {
      if (std::find(kSections.begin(), kSections.end(), key) == kSections.end())
        throw Error(line_of(source, v) + "unknown section [" + key +
                    "] (expected model, data, optimizer, schedule, train, quant)");
      for (auto&& [k2, v2] : *t) set_from(key + "." + std::string(k2.str()), v2, line_of(source, v2));
    } else {
      set_from(key, v, line_of(source, v));
    }
  }
  for (const auto& o : overrides) {
    const auto eq = o.find('=');
    const std::string where = "--set " + o + ": ";
    if (eq == std::string::npos || eq == 0) throw Error(where + "expected key=value");
    const std::string key = o.substr(0, eq), value = o.substr(eq + 1);
    toml::table vt;
    try {
      vt = parse_toml("v = " + value, where);
    } catch (const Error&) {
      vt = toml::table{{"v", value}};  // not TOML: a bare string
    }
    if (find_field(fs, key) && takes_text(*find_field(fs, key)) && !vt["v"].is_string())
      vt = toml::table{{"v", value}};  // e.g. --set quant.recipe=fp32 parses as a key, or 1.4.3 as a number
    set_from(key, *vt.get("v"), where);
  }
  check_ranges(c);
  return c;
}

std::string to_toml(const TrainConfig& cin) {
  TrainConfig c = cin;
  std::string out = "schema = " + std::to_string(kConfigSchema) + "\n", section;
  for (const auto& f : fields(c)) {
    if (unset_setting(f)) continue;
    const auto dot = f.key.find('.');
    std::string leaf = f.key;
    if (dot != std::string::npos) {
      const std::string sec = f.key.substr(0, dot);
      if (sec != section) out += "\n[" + sec + "]\n";
      section = sec;
      leaf = f.key.substr(dot + 1);
    }
    std::string value;
    std::visit(
        [&](auto* p) {
          using T = std::remove_pointer_t<decltype(p)>;
          if constexpr (std::is_same_v<T, std::string>) {
            value = nlohmann::json(*p).dump();  // a JSON string is a valid TOML basic string
          } else if constexpr (kIsSpelled<T>) {
            value = nlohmann::json(p->text).dump();
          } else if constexpr (kIsSetting<T>) {
            value = nlohmann::json(setting_text(*p)).dump();
          } else if constexpr (std::is_same_v<T, bool>) {
            value = *p ? "true" : "false";
          } else if constexpr (std::is_same_v<T, double>) {
            value = shortest_float(*p);
          } else if constexpr (std::is_same_v<T, std::vector<double>>) {
            value = "[";
            for (std::size_t i = 0; i < p->size(); ++i) value += (i ? ", " : "") + shortest_float((*p)[i]);
            value += "]";
          } else {
            value = std::to_string(*p);
          }
        },
        f.ptr);
    out += leaf + " = " + value + "\n";
  }
  return out;
}

// Keys added after runs were recorded, left out of the JSON at the value that reproduces
// those runs bit for bit: a stored config, a sweep's run identity and a checkpoint's config
// stay the same for every run that does not set them (model.channels_last: the runs
// recorded before it ran NCHW, so its default, channels-last, is written out).
namespace {
bool left_out_at_default(const std::string& key, const TrainConfig& c) {
  return (key == "quant.compute" && compute_of(c.quant) == nn::Compute::fp32) ||
         (key == "quant.accumulate" && accumulation_of(c.quant).plain()) ||
         (key == "data.drop_long" && c.data.drop_long == DataConfig{}.drop_long) ||
         (key == "model.bn_momentum" && c.model.bn_momentum == ModelConfig{}.bn_momentum) ||
         (key == "model.channels_last" && !c.model.channels_last);
}
}  // namespace

std::string to_json(const TrainConfig& cin) {
  TrainConfig c = cin;
  nlohmann::json j;
  j["schema"] = kConfigSchema;
  for (const auto& f : fields(c)) {
    if (unset_setting(f) || left_out_at_default(f.key, c)) continue;
    const auto dot = f.key.find('.');
    nlohmann::json& slot = dot == std::string::npos ? j[f.key] : j[f.key.substr(0, dot)][f.key.substr(dot + 1)];
    std::visit(
        [&](auto* p) {
          using T = std::remove_pointer_t<decltype(p)>;
          if constexpr (kIsSetting<T>)
            slot = setting_text(*p);  // set: unset ones were left out above
          else if constexpr (kIsSpelled<T>)
            slot = p->text;
          else
            slot = *p;
        },
        f.ptr);
  }
  return j.dump();
}

}  // namespace fp8lab::settings
