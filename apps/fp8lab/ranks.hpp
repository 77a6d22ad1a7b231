// `fp8lab train --nproc N`: the processes of a data-parallel run on this machine
// (docs/training.md). The program starts N copies of itself with the variables a cluster
// launcher would set (RANK, WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT: a free port,
// LOCAL_RANK) and watches them:
//  - Ctrl-C reaches the ranks once, through this process (they run in their own process
//    group), and they stop together with a checkpoint;
//  - when a rank fails or dies, the others end on their own (a closed connection, or the
//    collective timeout); any still running `timeout` seconds later are killed;
//  - if this process dies, the ranks get SIGTERM (PR_SET_PDEATHSIG).
#pragma once

#include <string>
#include <vector>

namespace fp8lab::cli {

// Runs `args` (the program's own arguments after its path) as ranks 0..n-1 and waits for
// them. Returns rank 0's exit status when every rank exited normally, else the first
// failure's (128 + signal for a rank killed by a signal), after saying which rank failed how.
int run_ranks(int n, const std::vector<std::string>& args, double timeout_seconds);

}  // namespace fp8lab::cli
