// What this build of the program holds. Without libtorch (FP8LAB_WITH_TORCH=OFF) it has the
// commands of the formats, the store and the studies (formats, values, snr, quantize, runs,
// report, sweep --dry-run) but no training layer: configs are completed and range-checked
// (complete_settings) but their task, model and data names are not looked up.
#pragma once

#include "fp8lab/settings/config.hpp"
#include "fp8lab/study/sweep.hpp"
#ifdef FP8LAB_HAVE_TORCH
#include "fp8lab/train/registry.hpp"
#endif

namespace fp8lab::cli {

#ifdef FP8LAB_HAVE_TORCH
inline constexpr bool kCanTrain = true;
inline constexpr study::ConfigCheck kConfigCheck = train::complete_config;
#else
inline constexpr bool kCanTrain = false;
inline constexpr study::ConfigCheck kConfigCheck = settings::complete_settings;
#endif

// What a command that needs the training layer says in a build without it.
inline constexpr const char* kNoTrainingLayer =
    "this fp8lab was built without libtorch (FP8LAB_WITH_TORCH=OFF), so it cannot train: build it with "
    "libtorch (scripts/quickstart.sh) for train, evaluate, quickstart and sweeps that run";

}  // namespace fp8lab::cli
