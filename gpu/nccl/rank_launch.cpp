#include "gpu/nccl/rank_launch.h"

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "gpu/nccl/nccl_comm.h"

extern char** environ;

namespace bp::nccl {
namespace {

// The fds a launched rank finds its relay on (dup2'ed there by the launcher).
constexpr int kRelayFd = 3;   // launcher → rank: a peer's failure, one line each
constexpr int kStatusFd = 4;  // rank → launcher: this rank's failure

std::optional<int> env_int(const char* name) {
  const char* s = std::getenv(name);
  if (!s || !*s) return std::nullopt;
  char* end = nullptr;
  const long v = std::strtol(s, &end, 10);
  if (*end || v < 0 || v > 1 << 20) throw std::invalid_argument(std::string(name) + "=" + s + " is not a rank number");
  return static_cast<int>(v);
}

std::string hex(const ncclUniqueId& id) {
  static const char digits[] = "0123456789abcdef";
  std::string s;
  for (char c : id.internal) {
    s += digits[static_cast<unsigned char>(c) >> 4];
    s += digits[static_cast<unsigned char>(c) & 15];
  }
  return s;
}

ncclUniqueId from_hex(const std::string& s) {
  ncclUniqueId id{};
  if (s.size() != 2 * sizeof id.internal) throw std::invalid_argument("BP_NCCL_ID is not an NCCL id");
  auto nibble = [&](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    throw std::invalid_argument("BP_NCCL_ID is not an NCCL id");
  };
  for (size_t i = 0; i < sizeof id.internal; ++i)
    id.internal[i] = static_cast<char>(nibble(s[2 * i]) << 4 | nibble(s[2 * i + 1]));
  return id;
}

std::string exit_text(int status) {
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = sigabbrev_np(sig);
    return std::string("was killed by signal ") + std::to_string(sig) + (name ? std::string(" (SIG") + name + ")" : "");
  }
  return "exited with code " + std::to_string(WEXITSTATUS(status));
}

void write_line(int fd, std::string line) {
  std::replace(line.begin(), line.end(), '\n', ' ');
  line.resize(std::min<size_t>(line.size(), PIPE_BUF - 1));  // one atomic write
  line += '\n';
  while (::write(fd, line.data(), line.size()) < 0 && errno == EINTR) {
  }
}

std::atomic<pid_t> g_rank0_pid{0};
extern "C" void forward_to_rank0(int sig) {
  if (const pid_t p = g_rank0_pid.load()) ::kill(p, sig);
}

struct Child {
  pid_t pid = 0;
  int relay = -1;   // we write
  int status = -1;  // we read
  std::string pending;
  bool done = false;
  int exit_status = 0;
};

}  // namespace

std::optional<RankIdentity> rank_identity_from_env() {
  struct Source {
    const char *rank, *world, *local, *name;
  };
  static const Source sources[] = {
      {"BP_RANK", "BP_WORLD_SIZE", "BP_LOCAL_RANK", "bitparity"},
      {"RANK", "WORLD_SIZE", "LOCAL_RANK", "torchrun"},
      {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "Open MPI"},
      {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "PMI"},
      {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "Slurm"},
  };
  for (const Source& s : sources) {
    const auto rank = env_int(s.rank);
    if (!rank) continue;
    const auto world = env_int(s.world);
    if (!world || *world < 1 || *rank >= *world)
      throw std::invalid_argument(std::string(s.name) + "'s variables disagree: " + s.rank + "=" +
                                  std::to_string(*rank) + ", " + s.world + "=" + (world ? std::to_string(*world) : "unset"));
    return RankIdentity{*rank, *world, env_int(s.local).value_or(*rank), s.name};
  }
  return std::nullopt;
}

ncclUniqueId shared_unique_id(const RankIdentity& me) {
  if (const char* id = std::getenv("BP_NCCL_ID")) return from_hex(id);
  if (!std::getenv("NCCL_COMM_ID")) {
    const char *addr = std::getenv("MASTER_ADDR"), *port = std::getenv("MASTER_PORT");
    if (!addr || !port || !*addr || !*port)
      throw std::invalid_argument("rank " + std::to_string(me.rank) + " (launched by " + me.launcher +
                                  "): set MASTER_ADDR and MASTER_PORT (or NCCL_COMM_ID=host:port) to rank 0's host "
                                  "and a free port, where NCCL's bootstrap meets");
    // torchrun's agent holds MASTER_PORT for its own store: NCCL meets on the next one.
    const std::string nccl_port = me.launcher == "torchrun" ? std::to_string(std::atoi(port) + 1) : port;
    ::setenv("NCCL_COMM_ID", (std::string(addr) + ":" + nccl_port).c_str(), 1);
  }
  ncclUniqueId id{};
  if (const ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess)
    throw std::invalid_argument(std::string("NCCL_COMM_ID=") + std::getenv("NCCL_COMM_ID") + ": " +
                                ncclGetErrorString(r));
  return id;
}

void listen_to_launcher() {
  if (!std::getenv("BP_RELAY_FD")) return;
  std::thread([] {
    std::string line;
    char c;
    for (;;) {
      const ssize_t n = ::read(kRelayFd, &c, 1);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        request_abort("the launcher (the bitparity process that started the ranks) is gone");
        return;
      }
      if (c != '\n') {
        line += c;
        continue;
      }
      request_abort(line);
      line.clear();
    }
  }).detach();
}

void tell_launcher(const std::string& failure) {
  if (std::getenv("BP_STATUS_FD")) write_line(kStatusFd, failure);
}

int launch_local_ranks(int world, const std::vector<std::string>& args) {
  ncclUniqueId id{};
  if (const ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess)
    throw std::runtime_error(std::string("ncclGetUniqueId: ") + ncclGetErrorString(r));
  std::vector<Child> ranks(static_cast<size_t>(world));
  std::vector<char*> argv{const_cast<char*>("/proc/self/exe")};
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t group = 0;
  for (int r = 0; r < world; ++r) {
    int relay[2], status[2];
    if (::pipe2(relay, O_CLOEXEC) || ::pipe2(status, O_CLOEXEC)) throw std::runtime_error("pipe2 failed");
    const std::pair<std::string, std::string> mine[] = {{"BP_RANK", std::to_string(r)},
                                                        {"BP_WORLD_SIZE", std::to_string(world)},
                                                        {"BP_LOCAL_RANK", std::to_string(r)},
                                                        {"BP_NCCL_ID", hex(id)},
                                                        {"BP_RELAY_FD", std::to_string(kRelayFd)},
                                                        {"BP_STATUS_FD", std::to_string(kStatusFd)}};
    // The environment as it is (BP_RANK_TIMEOUT_S, NCCL_*, ...), with ours in place of any stale ones.
    std::vector<std::string> env_text;
    for (char** e = environ; *e; ++e) {
      const std::string_view var(*e);
      const bool ours = std::any_of(std::begin(mine), std::end(mine), [&](const auto& kv) {
        return var.substr(0, kv.first.size() + 1) == kv.first + "=";
      });
      if (!ours) env_text.emplace_back(var);
    }
    for (const auto& [k, v] : mine) env_text.push_back(k + "=" + v);
    std::vector<char*> envp;
    for (std::string& e : env_text) envp.push_back(e.data());
    envp.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, relay[0], kRelayFd);
    posix_spawn_file_actions_adddup2(&fa, status[1], kStatusFd);
    // Own process group: a terminal's Ctrl-C reaches the launcher only, which
    // hands it to rank 0 alone (the followers wait for rank 0's word).
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attr, group);
    pid_t pid = 0;
    const int err = posix_spawn(&pid, "/proc/self/exe", &fa, &attr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    ::close(relay[0]);
    ::close(status[1]);
    if (err) throw std::runtime_error(std::string("cannot start rank ") + std::to_string(r) + ": " + std::strerror(err));
    if (!group) group = pid;
    ranks[static_cast<size_t>(r)] = Child{pid, relay[1], status[0], {}, false, 0};
  }
  g_rank0_pid = ranks[0].pid;
  struct sigaction sa {}, old_int{}, old_term{};
  sa.sa_handler = forward_to_rank0;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);

  auto announce = [&](int from, const std::string& what) {
    for (int r = 0; r < world; ++r)
      if (r != from && !ranks[static_cast<size_t>(r)].done) write_line(ranks[static_cast<size_t>(r)].relay, what);
  };
  std::optional<std::chrono::steady_clock::time_point> rank0_done_at;
  size_t running = ranks.size();
  while (running) {
    std::vector<pollfd> fds;
    for (const Child& c : ranks) fds.push_back({c.status, POLLIN, 0});
    ::poll(fds.data(), fds.size(), 100);
    for (size_t r = 0; r < ranks.size(); ++r) {
      Child& c = ranks[r];
      if (fds[r].revents & POLLIN) {
        char buf[PIPE_BUF];
        const ssize_t n = ::read(c.status, buf, sizeof buf);
        for (ssize_t i = 0; i < n; ++i) {
          if (buf[i] != '\n') {
            c.pending += buf[i];
            continue;
          }
          announce(static_cast<int>(r), c.pending);
          c.pending.clear();
        }
      }
      if (c.done) continue;
      int st = 0;
      if (::waitpid(c.pid, &st, WNOHANG) != c.pid) continue;
      c.done = true;
      c.exit_status = st;
      --running;
      if (r == 0) {
        rank0_done_at = std::chrono::steady_clock::now();
        g_rank0_pid = 0;
      }
      // Followers end with 0 after rank 0's last word; anything else is a failure.
      const bool failed = WIFSIGNALED(st) || (r != 0 && WEXITSTATUS(st) != 0);
      if (failed) announce(static_cast<int>(r), "rank " + std::to_string(r) + " " + exit_text(st));
    }
    // Followers leave once rank 0 tells them; a stuck one is stopped.
    if (rank0_done_at && std::chrono::steady_clock::now() - *rank0_done_at > std::chrono::seconds(60))
      for (Child& c : ranks)
        if (!c.done) ::kill(c.pid, SIGKILL);
  }
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  for (const Child& c : ranks) {
    ::close(c.relay);
    ::close(c.status);
  }
  const int st0 = ranks[0].exit_status;
  if (WIFEXITED(st0)) return WEXITSTATUS(st0);
  std::fprintf(stderr, "bitparity: rank 0 %s; it wrote no report\n", exit_text(st0).c_str());
  return 3;
}

}  // namespace bp::nccl
