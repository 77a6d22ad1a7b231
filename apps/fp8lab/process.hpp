// How the fp8lab program sets up its process, once, before any subcommand runs. The
// libraries change no process-wide state of their own; these are the program's choices:
//  - the environment libtorch loads with (OpenBLAS kernels, OpenMP spinning): set by the
//    launcher before this module loads (apps/launcher/process_env.hpp);
//  - the allocator: glibc malloc keeps freed blocks of up to 1 GiB in the heap instead of
//    returning them to the system (M_MMAP_THRESHOLD, M_TRIM_THRESHOLD). A training step
//    frees and allocates the same activation buffers every step; with glibc's defaults
//    each large buffer is a fresh mmap whose pages fault in again on every step;
//  - libtorch's threads and flush-to-zero: per run, from the run's config
//    (train.threads, train.flush_denormals), applied by train::train for the run's
//    duration and restored afterwards (nn/runtime.hpp).
//  - SIGXFSZ ignored (as Python does): a write past a file-size limit (`ulimit -f`) then
//    fails with EFBIG, which the writers report and clean up after, instead of killing
//    the process with its temporaries left behind.
// A program of your own that links the libraries can make the same choices on purpose.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace fp8lab::cli {

void setup_process();

// The path of this program (the `fp8lab` launcher), for starting copies of it (sweep runs,
// --nproc ranks) and for the scripts it writes (--emit slurm). Throws Error when the
// system does not say (/proc/self/exe unreadable).
std::string self_program();

// Removes the folders fp8lab-sweep-* in `tmp` whose owner file names a process that has
// ended: copies left by a sweep that was killed (SIGKILL, a second Ctrl-C) before it could
// remove its own. Says on stderr what it removed; a folder it cannot remove stays.
void remove_stale_copies(const std::filesystem::path& tmp);

// The pids of the other sweeps running on this machine: the live owners of the folders
// fp8lab-sweep-* in `tmp`, this process left out, in increasing order.
std::vector<long> other_sweeps(const std::filesystem::path& tmp);

// A private copy of this program, the launcher and the libfp8lab_cli.so beside it, in a
// fresh folder fp8lab-sweep-XXXXXX of the temporary directory (TMPDIR), with a file
// `owner` holding this process's pid; removed with the object, and by a later sweep's
// remove_stale_copies if this process is killed first. A sweep starts its runs from it,
// so that relinking the build folder while a sweep goes on changes none of the runs it
// starts later. Throws Error naming the file it could not copy.
class ProgramCopy {
 public:
  ProgramCopy();
  ~ProgramCopy();
  ProgramCopy(const ProgramCopy&) = delete;
  ProgramCopy& operator=(const ProgramCopy&) = delete;
  const std::string& program() const { return program_; }
  std::string folder() const { return dir_.string(); }

 private:
  std::filesystem::path dir_;
  std::string program_;
};

}  // namespace fp8lab::cli
