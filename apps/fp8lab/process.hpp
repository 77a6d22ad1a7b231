// How the fp8lab program sets up its process, once, before any subcommand runs. The
// libraries change no process-wide state of their own; these are the program's choices:
//  - the environment libtorch loads with (OpenBLAS kernels, OpenMP spinning): set by the
//    launcher before this module loads (apps/launcher/process_env.hpp);
//  - the allocator: glibc malloc keeps freed blocks of up to 1 GiB in the heap instead of
//    returning them to the system (M_MMAP_THRESHOLD, M_TRIM_THRESHOLD). A training step
//    frees and allocates the same activation buffers every step; with glibc's defaults
//    each large buffer is a fresh mmap whose pages fault in again on every step;
//  - libtorch's threads and flush-to-zero: per run, from the run's config
//    (train.threads, train.flush_denormals), applied by experiments::train for the run's
//    duration and restored afterwards (nn/runtime.hpp).
// A program of your own that links the libraries can make the same choices on purpose.
#pragma once

#include <string>

namespace fp8lab::cli {

void setup_process();

// The path of this program (the `fp8lab` launcher), for starting copies of it (sweep runs,
// --nproc ranks) and for the scripts it writes (--emit slurm). Throws Error when the
// system does not say (/proc/self/exe unreadable).
std::string self_program();

}  // namespace fp8lab::cli
