// The statistics hooks' records as rows of the results store (histograms as JSON): what a
// run records (src/train/run_record.cpp) and what Python's
// QuantContext.take_stat_rows() returns.
#pragma once

#include <vector>

#include "fp8lab/nn/ops.hpp"
#include "fp8lab/results/store.hpp"

namespace fp8lab::train {

std::vector<results::Store::StatRow> stat_rows(std::vector<nn::TensorStats> records);

}  // namespace fp8lab::train
