#include "train_state.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "fp8lab/nn/runtime.hpp"
#include "fp8lab/core/files.hpp"
#include "fp8lab/results/store.hpp"

namespace fp8lab::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// --- the JSON half: every number of the state -----------------------------------------

json counts_json(const std::vector<std::array<QuantCounts, nn::kKinds>>& counts) {
  json out = json::array();
  for (const auto& layer : counts) {
    json l = json::array();
    for (const auto& c : layer) l.push_back({c.total, c.overflow, c.underflow, c.nan});
    out.push_back(l);
  }
  return out;
}

std::vector<std::array<QuantCounts, nn::kKinds>> counts_from(const json& j) {
  std::vector<std::array<QuantCounts, nn::kKinds>> out;
  for (const auto& l : j) {
    std::array<QuantCounts, nn::kKinds> layer{};
    for (int k = 0; k < nn::kKinds; ++k) {
      const auto& v = l.at(k);
      layer[k] = {v.at(0).get<std::uint64_t>(), v.at(1).get<std::uint64_t>(), v.at(2).get<std::uint64_t>(),
                  v.at(3).get<std::uint64_t>()};
    }
    out.push_back(layer);
  }
  return out;
}

json histories_json(const std::vector<std::vector<nn::AmaxHistories::History>>& layers) {
  json out = json::array();
  for (const auto& layer : layers) {
    json l = json::array();
    for (const auto& h : layer)
      l.push_back({{"kind", nn::to_string(h.kind)}, {"operand", h.operand}, {"amax", h.amaxes}});
    out.push_back(l);
  }
  return out;
}

std::vector<std::vector<nn::AmaxHistories::History>> histories_from(const json& j) {
  std::vector<std::vector<nn::AmaxHistories::History>> out;
  for (const auto& l : j) {
    std::vector<nn::AmaxHistories::History> layer;
    for (const auto& h : l)
      layer.push_back({nn::parse_kind(h.at("kind").get<std::string>()), h.at("operand").get<std::uint32_t>(),
                       h.at("amax").get<std::vector<float>>()});
    out.push_back(std::move(layer));
  }
  return out;
}

json state_json(const TrainState& s) {
  std::vector<std::size_t> recent;
  for (const auto& r : s.recent) recent.push_back(r.size());
  return {{"step", s.step},         {"loss_ema", s.loss_ema},     {"scaler", s.scaler},
          {"evals", s.evals},       {"counts", counts_json(s.counts)}, {"trace", s.trace},
          {"histories", histories_json(s.histories)},
          {"seconds", s.seconds},   {"run_id", s.run_id},         {"store", s.store},
          {"finished", s.finished}, {"ema", s.ema.size()},        {"recent", recent},
          {"processes", s.processes}};
}

// The numbers; the tensor lists are sized from the JSON and filled by read_weights.
TrainState state_from(const json& j) {
  TrainState s;
  s.step = j.at("step").get<std::int64_t>();
  s.loss_ema = j.at("loss_ema").get<double>();
  s.scaler = j.at("scaler").get<std::vector<double>>();
  s.evals = j.at("evals").get<std::vector<std::pair<std::int64_t, double>>>();
  s.counts = counts_from(j.at("counts"));
  if (j.contains("histories")) s.histories = histories_from(j.at("histories"));  // none before scaled formats
  s.trace = j.at("trace").get<LossScaleTrace>();
  s.seconds = j.at("seconds").get<double>();
  s.run_id = j.at("run_id").get<std::int64_t>();
  s.store = j.at("store").get<std::string>();
  s.finished = j.at("finished").get<bool>();
  s.processes = j.value("processes", 1);  // absent before data-parallel runs
  if (s.processes < 1) throw std::runtime_error("metadata: processes " + std::to_string(s.processes));
  // Tensor counts: a model's parameters and buffers; at most train.average_last (<= 100) lists.
  constexpr std::size_t kMaxTensors = 1 << 20, kMaxRecent = 100;
  const auto tensors = [&](std::size_t n) {
    if (n > kMaxTensors) throw std::runtime_error("metadata: " + std::to_string(n) + " weight tensors");
    return n;
  };
  s.ema.resize(tensors(j.at("ema").get<std::size_t>()));
  const auto recent = j.at("recent").get<std::vector<std::size_t>>();
  if (recent.size() > kMaxRecent) throw std::runtime_error("metadata: " + std::to_string(recent.size()) + " recent weight sets");
  for (std::size_t n : recent) s.recent.emplace_back(tensors(n));
  return s;
}

// --- the tensor half ---------------------------------------------------------------------

void write_weights(torch::serialize::OutputArchive& a, const std::string& key, const Weights& w) {
  torch::serialize::OutputArchive sub;
  for (std::size_t i = 0; i < w.size(); ++i) sub.write("t" + std::to_string(i), w[i]);
  a.write(key, sub);
}

void read_weights(torch::serialize::InputArchive& a, const std::string& key, Weights& w) {
  torch::serialize::InputArchive sub;
  a.read(key, sub);
  for (std::size_t i = 0; i < w.size(); ++i) sub.read("t" + std::to_string(i), w[i]);
}

std::string recent_key(std::size_t k) { return "recent" + std::to_string(k); }

// --- the file: one header line with the archive's length and checksum, then the archive --

constexpr std::string_view kMagic = "fp8lab-checkpoint ";

// The archive bytes of a checkpoint file, its length and checksum verified. A file without
// the header line is refused before libtorch reads a byte of it: it is damaged (the line
// deleted or overwritten), not a checkpoint, or from schema 1, which this fp8lab does not
// read either.
std::string unframed(const std::string& path) {
  std::string bytes = read_file(path);
  if (!checksum_unframe(bytes, kMagic, path, "checkpoint"))
    throw Error(path + ": not an fp8lab checkpoint: it does not start with the integrity line '" +
                std::string(kMagic) + "bytes=N fnv1a64=H' (damaged, not written by fp8lab, or of schema 1, " +
                "which this fp8lab does not read)");
  return bytes;
}

// The JSON header of a checkpoint archive.
json read_meta(torch::serialize::InputArchive& a) {
  c10::IValue m;
  a.read("meta", m);
  json j = json::parse(m.toStringRef());
  if (!j.is_object()) throw Error("its metadata is not a JSON object");
  return j;
}

}  // namespace

void save_checkpoint(const std::string& path, const std::string& config_json, const TrainState& state,
                     torch::nn::Module& model, torch::optim::Optimizer& optimizer) {
  torch::serialize::OutputArchive a;
  const json meta = {{"schema", kCheckpointSchema},
                     {"config", config_json},
                     {"code_version", results::Store::code_version()},
                     {"state", state_json(state)}};
  a.write("meta", c10::IValue(meta.dump()));
  torch::serialize::OutputArchive m, o;
  model.save(m);
  optimizer.save(o);
  a.write("model", m);
  a.write("optimizer", o);
  write_weights(a, "ema", state.ema);
  for (std::size_t k = 0; k < state.recent.size(); ++k) write_weights(a, recent_key(k), state.recent[k]);
  std::string bytes;
  a.save_to([&](const void* p, std::size_t n) {
    bytes.append(static_cast<const char*>(p), n);
    return n;
  });
  const fs::path target = fs::absolute(path);
  if (target.has_parent_path()) make_folder(target.parent_path().string());
  write_file_atomic(target.string(), checksum_frame(kMagic, bytes));
}

namespace {

// The keys (JSON pointers) in which two configs differ.
std::string config_difference(const std::string& a, const std::string& b) {
  std::string diff;
  for (const auto& d : json::diff(json::parse(a), json::parse(b)))
    diff += (diff.empty() ? "" : ", ") + d["path"].get<std::string>();
  return diff;
}

}  // namespace

const std::vector<std::string>& Checkpoint::evaluation_keys() {
  static const std::vector<std::string> keys = {"threads",          "train.checkpoint", "train.beam",
                                                "train.bleu_lowercase", "data.test_limit", "quant.compute"};
  return keys;
}

namespace {
// `config_json` without the evaluation keys.
std::string training_part(const std::string& config_json) {
  json j = json::parse(config_json);
  for (const std::string& key : Checkpoint::evaluation_keys()) {
    const auto dot = key.find('.');
    if (dot == std::string::npos) j.erase(key);
    else if (j.contains(key.substr(0, dot))) j[key.substr(0, dot)].erase(key.substr(dot + 1));
  }
  return j.dump();
}
}  // namespace

Checkpoint::Checkpoint(const std::string& path, const std::string& config_json, Use use) : path_(path) {
  if (!fs::exists(path))
    throw Error(path + (use == Use::resume ? ": no checkpoint to resume from" : ": no checkpoint to evaluate"));
  bytes_ = unframed(path);
  read(config_json, use);
}

Checkpoint::Checkpoint(Archive, const std::string& name, std::string archive, const std::string& config_json)
    : path_(name), bytes_(std::move(archive)) {
  read(config_json, Use::resume);
}

void Checkpoint::read(const std::string& config_json, Use use) {
  const std::string& path = path_;
  json meta;
  try {
    archive_.load_from(bytes_.data(), bytes_.size());
    meta = read_meta(archive_);
  } catch (const std::exception& e) {
    throw Error(path + ": not a readable fp8lab checkpoint (" + nn::torch_error_text(e, 200) + ")");
  }
  const int schema = meta.value("schema", 0);
  if (schema != kCheckpointSchema)
    throw Error(path + ": checkpoint schema " + std::to_string(schema) + ", this fp8lab reads schema " +
                std::to_string(kCheckpointSchema) + " only; start the run afresh without --resume");
  try {
    state_ = state_from(meta.at("state"));
    if (state_.finished && use == Use::resume)
      throw Error(path + ": this run has finished; there is nothing to resume (start afresh without --resume)");
    const std::string written_with = meta.at("config").get<std::string>();
    if (use == Use::resume && written_with != config_json)
      throw Error(path + ": checkpoint was written with a different config (" +
                  config_difference(written_with, config_json) +
                  "); resume with the same config, or start afresh without --resume");
    if (use == Use::evaluate && training_part(written_with) != training_part(config_json))
      throw Error(path + ": checkpoint was written with a different config (" +
                  config_difference(training_part(written_with), training_part(config_json)) +
                  "); evaluate with the run's config (only the evaluation's keys may differ: " + [] {
                    std::string keys;
                    for (const std::string& k : evaluation_keys()) keys += (keys.empty() ? "" : ", ") + k;
                    return keys;
                  }() + ")");
    read_weights(archive_, "ema", state_.ema);
    for (std::size_t k = 0; k < state_.recent.size(); ++k) read_weights(archive_, recent_key(k), state_.recent[k]);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(path + ": damaged checkpoint (" + nn::torch_error_text(e, 200) + ")");
  }
}

void Checkpoint::restore(torch::nn::Module& model, torch::optim::Optimizer& optimizer) {
  try {
    torch::serialize::InputArchive m, o;
    archive_.read("model", m);
    archive_.read("optimizer", o);
    model.load(m);
    optimizer.load(o);
  } catch (const std::exception& e) {
    throw Error(path_ + ": checkpoint does not fit the model (" + nn::torch_error_text(e, 200) + ")");
  }
}

void refuse_unfinished_checkpoint(const std::string& path) {
  if (!fs::exists(path)) return;
  const std::string choices = "; continue it with --resume, or discard it and start afresh with --restart";
  json meta;
  try {
    const std::string bytes = unframed(path);
    torch::serialize::InputArchive a;
    a.load_from(bytes.data(), bytes.size());
    meta = read_meta(a);
  } catch (const std::exception&) {
    throw Error(path + ": a file that is not a readable checkpoint is in the way; remove it, or start with "
                       "--restart to replace it");
  }
  const json state = meta.value("state", json::object());
  if (state.value("finished", false)) return;
  throw Error(path + ": holds the checkpoint of an unfinished run (step " +
              std::to_string(state.value("step", meta.value("step", 0))) + ")" + choices);
}

namespace {
// The path a checkpoint's name stands for: symbolic links followed, also one whose target
// does not exist yet (a run's first checkpoint), then "." and ".." resolved.
fs::path real_path(const std::string& name) {
  fs::path p = fs::absolute(name);
  std::error_code ec;
  for (int hops = 0; hops < 40 && fs::is_symlink(p, ec); ++hops) {
    const fs::path target = fs::read_symlink(p, ec);
    if (ec) break;
    p = target.is_absolute() ? target : p.parent_path() / target;
  }
  const fs::path real = fs::weakly_canonical(p, ec);
  return ec ? p.lexically_normal() : real;
}
}  // namespace

CheckpointLock::CheckpointLock(const std::string& checkpoint) {
  // Keyed by the checkpoint's real path: every name of it (a symbolic link, "./", "..")
  // takes the same lock.
  const fs::path lock = real_path(checkpoint).string() + ".lock";
  if (lock.has_parent_path()) make_folder(lock.parent_path().string());
  fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error(lock.string() + ": cannot create the checkpoint lock (" + std::strerror(errno) + ")");
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    char owner[32] = {};
    const ssize_t n = ::pread(fd_, owner, sizeof owner - 1, 0);
    ::close(fd_);
    fd_ = -1;
    throw Error(checkpoint + ": another run is using this checkpoint (process " +
                std::string(owner, n > 0 ? static_cast<std::size_t>(n) : 0) +
                "); give this run its own name or train.checkpoint");
  }
  const std::string pid = std::to_string(::getpid());
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, pid.data(), pid.size(), 0) < 0) {
    // The lock holds without the note; only the message naming the owner loses it.
  }
}

CheckpointLock::~CheckpointLock() {
  if (fd_ >= 0) ::close(fd_);  // closing releases the flock
}

}  // namespace fp8lab::train
