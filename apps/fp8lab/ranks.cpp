#include "ranks.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string_view>
#include <thread>

#include "fp8lab/core/error.hpp"
#include "process.hpp"

namespace fp8lab::cli {

namespace {

volatile sig_atomic_t g_group = 0;  // the ranks' process group

extern "C" void forward_sigint(int) {
  if (g_group > 0) ::kill(-g_group, SIGINT);
}

// While the ranks run, a SIGINT to the launcher goes to forward_sigint. SIGINT is held while
// they start (they inherit the hold and each releases it once its own handler is in place)
// and released by release(): a Ctrl-C that came meanwhile, or one that a sweep passes on to
// a launcher it started with SIGINT held, is passed on once there is a group to pass it to.
// The destructor restores the mask and the default action.
class SigintToRanks {
 public:
  SigintToRanks() {
    sigemptyset(&sigint_);
    sigaddset(&sigint_, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigint_, &before_);
    std::signal(SIGINT, forward_sigint);
  }
  SigintToRanks(const SigintToRanks&) = delete;
  SigintToRanks& operator=(const SigintToRanks&) = delete;
  void release() { pthread_sigmask(SIG_UNBLOCK, &sigint_, nullptr); }
  ~SigintToRanks() {
    pthread_sigmask(SIG_SETMASK, &before_, nullptr);
    std::signal(SIGINT, SIG_DFL);
    g_group = 0;
  }

 private:
  sigset_t sigint_, before_;
};

// A TCP port on the loopback interface that is free now (the kernel's choice).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw Error(std::string("--nproc: cannot open a socket (") + std::strerror(errno) + ")");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(fd);
    throw Error(std::string("--nproc: cannot find a free port (") + std::strerror(errno) + ")");
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

// Starts rank `r` in process group `group` (0: a new group led by this rank). Everything
// the child needs is prepared before fork: after it, only async-signal-safe calls.
pid_t start_rank(int r, int n, int port, pid_t group, const std::string& exe, const std::vector<std::string>& args) {
  std::vector<std::string> env_strings = {"RANK=" + std::to_string(r), "LOCAL_RANK=" + std::to_string(r),
                                          "WORLD_SIZE=" + std::to_string(n), "LOCAL_WORLD_SIZE=" + std::to_string(n),
                                          "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(port)};
  std::vector<char*> envp;
  for (auto& e : env_strings) envp.push_back(e.data());
  for (char** e = environ; *e; ++e) {
    const std::string_view v(*e);
    bool ours = false;
    for (const char* k : {"RANK=", "LOCAL_RANK=", "WORLD_SIZE=", "LOCAL_WORLD_SIZE=", "MASTER_ADDR=", "MASTER_PORT="})
      ours = ours || v.rfind(k, 0) == 0;
    if (!ours) envp.push_back(*e);
  }
  envp.push_back(nullptr);
  std::vector<std::string> argv_strings = {exe};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_strings) argv.push_back(a.data());
  argv.push_back(nullptr);
  static const char kCannotRun[] = "fp8lab: a rank could not start this program\n";

  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) throw Error(std::string("--nproc: fork failed (") + std::strerror(errno) + ")");
  if (pid > 0) return pid;
  ::setpgid(0, group);
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (::getppid() != parent) ::_exit(127);
  ::signal(SIGINT, SIG_DFL);
  ::execve(argv[0], argv.data(), envp.data());
  (void)!::write(2, kCannotRun, sizeof kCannotRun - 1);
  ::_exit(127);
}

std::string describe(int status) {
  if (WIFSIGNALED(status)) return "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
                                  strsignal(WTERMSIG(status)) + ")";
  return "exited with status " + std::to_string(WEXITSTATUS(status));
}

bool failed(int status) { return WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) != 0); }

int exit_code(int status) { return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status); }

}  // namespace

int run_ranks(int n, const std::vector<std::string>& args, double timeout_seconds) {
  const std::string exe = self_program();
  const int port = free_port();
  std::vector<pid_t> pids;
  std::vector<int> status(static_cast<std::size_t>(n), 0);
  std::vector<bool> done(static_cast<std::size_t>(n), false);
  SigintToRanks sigint;
  for (int r = 0; r < n; ++r) {
    std::vector<std::string> a = args;
    if (r > 0) a.push_back("--no-progress");
    pids.push_back(start_rank(r, n, port, r == 0 ? 0 : pids[0], exe, a));
    if (r == 0) {
      ::setpgid(pids[0], pids[0]);  // also here: the group must exist before rank 1 joins it
      g_group = pids[0];
    }
  }
  sigint.release();
  std::string list;
  for (const pid_t p : pids) {
    if (!list.empty()) list += ' ';
    list += std::to_string(p);
  }
  std::fprintf(stderr, "fp8lab: %d processes on this machine (ranks 0..%d: pids %s), rendezvous at 127.0.0.1:%d\n", n,
               n - 1, list.c_str(), port);
  int first_failure = -1, left = n;
  std::chrono::steady_clock::time_point deadline{};
  while (left > 0) {
    int st = 0;
    const pid_t pid = ::waitpid(-1, &st, first_failure >= 0 ? WNOHANG : 0);
    if (pid < 0 && errno == EINTR) continue;
    if (pid < 0) break;
    if (pid == 0) {  // a rank has failed: the others get until the deadline to end on their own
      if (std::chrono::steady_clock::now() > deadline) {
        for (int r = 0; r < n; ++r)
          if (!done[static_cast<std::size_t>(r)]) {
            std::fprintf(stderr, "fp8lab: rank %d still running %.0f s after rank %d failed: killing it\n", r,
                         timeout_seconds, first_failure);
            ::kill(pids[static_cast<std::size_t>(r)], SIGKILL);
          }
        deadline = std::chrono::steady_clock::time_point::max();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    for (int r = 0; r < n; ++r) {
      if (pids[static_cast<std::size_t>(r)] != pid) continue;
      done[static_cast<std::size_t>(r)] = true;
      status[static_cast<std::size_t>(r)] = st;
      --left;
      if (failed(st) && !(WIFEXITED(st) && WEXITSTATUS(st) == 130)) {
        std::fprintf(stderr, "fp8lab: rank %d of %d %s\n", r, n, describe(st).c_str());
        if (first_failure < 0) {
          first_failure = r;
          deadline = std::chrono::steady_clock::now() +
                     std::chrono::milliseconds(static_cast<std::int64_t>(timeout_seconds * 1000) + 5000);
        }
      }
    }
  }
  if (first_failure >= 0) return exit_code(status[static_cast<std::size_t>(first_failure)]);
  return exit_code(status[0]);
}

}  // namespace fp8lab::cli
