// The task registry (registry.hpp): each task with its models and data sets. The tasks
// themselves: image_task.cpp, translation_task.cpp, bert_task.cpp, lm_task.cpp.
#include <filesystem>
#include <algorithm>
#include <fstream>

#include "fp8lab/core/files.hpp"
#include "fp8lab/data/bitext.hpp"
#include "fp8lab/train/registry.hpp"
#include "fp8lab/models/bert.hpp"
#include "fp8lab/models/gpt.hpp"
#include "fp8lab/models/image_models.hpp"
#include "fp8lab/models/transformer.hpp"
#include "task.hpp"

namespace fp8lab::train {

const Registry<TaskInfo>& tasks() {
  static const Registry<TaskInfo> r(
      "task", {{"image-classification", {make_image_task, models::image_model_presets, image_data_sets, true}},
               {"translation", {make_translation_task, [] { return models::transformer_presets().names(); },
                                translation_data_sets, false}},
               {"bert", {make_bert_task, [] { return models::bert_presets().names(); }, text_data_sets, false}},
               {"language-model", {make_lm_task, [] { return models::gpt_presets().names(); }, text_data_sets, false}}});
  return r;
}

std::unique_ptr<Task> make_task(const settings::TrainConfig& cfg) { return tasks().at(cfg.task).make(cfg); }

const Registry<DataSetInfo>& text_data_sets() {
  static const Registry<DataSetInfo> r = [] {
    // Sentences one per line in document order (BERT: consecutive lines are the
    // next-sentence pairs; the language model: one stream).
    DataSetInfo bible, text;
    bible.default_dir = "data/bible-en-es", bible.prepare = [](const std::string& dir) { data::prepare_bible_corpus(dir); };
    bible.train_file = "train.en", bible.dev_file = "dev.en";
    text.needs_dir = true, text.train_file = "train.txt", text.dev_file = "dev.txt";
    return Registry<DataSetInfo>("text corpus", {{"bible-en", bible}, {"text", text}});
  }();
  return r;
}

std::vector<std::string> read_lines(const std::string& path) {
  const std::string text = read_file(path);  // a regular file within the memory budget: no FIFO, no /dev/zero
  std::vector<std::string> lines;
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t nl = std::min(text.find('\n', at), text.size());
    if (nl > at) lines.emplace_back(text, at, nl - at);
    at = nl + 1;
  }
  return lines;
}

std::string data_folder(const Registry<DataSetInfo>& sets, const settings::TrainConfig& cfg) {
  const DataSetInfo& set = sets.at(cfg.data.name);
  const std::string dir = cfg.data.dir.empty() ? set.default_dir : cfg.data.dir;
  if (set.prepare) set.prepare(dir);
  return dir;
}

}  // namespace fp8lab::train
