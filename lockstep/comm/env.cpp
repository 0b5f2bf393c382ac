#include "lockstep/comm/env.h"

#include <cctype>
#include <cstdlib>

#include "lockstep/core/error.h"
#include "lockstep/comm/mpi_meeting.h"

extern char** environ;

namespace lockstep {

namespace {

const std::string* find(const Environment& env, const std::string& name) {
  auto it = env.find(name);
  if (it == env.end() || it->second.empty()) return nullptr;
  return &it->second;
}

long long parse_integer(const std::string& text, const std::string& name, const std::string& launcher) {
  size_t used = 0;
  long long value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  LOCKSTEP_CHECK(used == text.size() && used > 0, "launcher '", launcher, "': ", name, "='", text,
                 "' is not an integer");
  return value;
}

std::string missing_hint(const std::string& launcher) {
  if (launcher == "pytorch") return " (start the program with `lockstep run` or torchrun)";
  if (launcher == "slurm") return " (start the program with srun inside a SLURM allocation)";
  if (launcher == "mpi") return " (start the program with Open MPI's mpirun)";
  return "";
}

int required_int(const Environment& env, const std::string& name, const std::string& launcher) {
  const std::string* value = find(env, name);
  LOCKSTEP_CHECK(value != nullptr, "launcher '", launcher, "': environment variable ", name, " is not set",
                 missing_hint(launcher));
  return static_cast<int>(parse_integer(*value, name, launcher));
}

int optional_int(const Environment& env, const std::string& name, const std::string& launcher, int fallback) {
  const std::string* value = find(env, name);
  return value ? static_cast<int>(parse_integer(*value, name, launcher)) : fallback;
}

int port_from(const Environment& env, const std::string& launcher, bool required) {
  const std::string* value = find(env, "MASTER_PORT");
  LOCKSTEP_CHECK(value != nullptr || !required, "launcher '", launcher,
                 "': environment variable MASTER_PORT is not set", missing_hint(launcher));
  if (value == nullptr) return 29500;
  long long port = parse_integer(*value, "MASTER_PORT", launcher);
  LOCKSTEP_CHECK(port >= 1 && port <= 65535, "launcher '", launcher, "': MASTER_PORT=", port,
                 " is not a TCP port (1-65535)");
  return static_cast<int>(port);
}

// Note [A port per SLURM job]: two jobs that share a node (several jobs of
// a few GPUs each on one machine) must not both listen on 29500. Without
// MASTER_PORT, a SLURM job's port is 15000 + the last four digits of its job
// id, as PyTorch Lightning's SLURMEnvironment does: the same on every task of
// the job, different for jobs that run side by side (unless their ids differ
// by a multiple of 10000), and the same again after a requeue (same job id).
int slurm_job_port(const Environment& env) {
  const std::string* job = find(env, "SLURM_JOB_ID");
  if (job == nullptr || job->empty() || job->find_first_not_of("0123456789") != std::string::npos) return 29500;
  const std::string last4 = job->size() > 4 ? job->substr(job->size() - 4) : *job;
  return 15000 + std::stoi(last4);
}

void validate(const DistEnv& env) {
  const std::string& l = env.launcher;
  LOCKSTEP_CHECK(env.world_size >= 1, "launcher '", l, "': the world size must be at least 1, got ", env.world_size);
  LOCKSTEP_CHECK(env.rank >= 0 && env.rank < env.world_size, "launcher '", l, "': rank ", env.rank,
                 " is not in [0, ", env.world_size, ") (the world size)");
  if (env.local_world_size > 0) {
    LOCKSTEP_CHECK(env.local_rank >= 0 && env.local_rank < env.local_world_size, "launcher '", l, "': local rank ",
                   env.local_rank, " is not in [0, ", env.local_world_size, ") (the local world size)");
  } else {
    LOCKSTEP_CHECK(env.local_rank >= 0, "launcher '", l, "': local rank ", env.local_rank, " is negative");
  }
  LOCKSTEP_CHECK(env.restart_count >= 0, "launcher '", l, "': TORCHELASTIC_RESTART_COUNT=", env.restart_count,
                 " is negative");
}

bool truthy(const std::string* value) {
  if (value == nullptr) return false;
  std::string lower;
  for (char c : *value) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return lower == "true" || lower == "1" || lower == "yes";
}

// The variables in which a launcher names a process's place.
struct PlaceVariables {
  const char* launcher;
  const char* rank;
  const char* world_size;
  const char* local_rank;
};

// A DistEnv of `names.launcher` with the rank, world size and local rank its
// variables hold (each required).
DistEnv place_from(const Environment& env, const PlaceVariables& names) {
  DistEnv out;
  out.launcher = names.launcher;
  out.rank = required_int(env, names.rank, out.launcher);
  out.world_size = required_int(env, names.world_size, out.launcher);
  out.local_rank = required_int(env, names.local_rank, out.launcher);
  return out;
}

DistEnv from_pytorch(const Environment& env) {
  DistEnv out = place_from(env, {"pytorch", "RANK", "WORLD_SIZE", "LOCAL_RANK"});
  out.local_world_size = optional_int(env, "LOCAL_WORLD_SIZE", out.launcher, -1);
  out.node_rank = optional_int(env, "GROUP_RANK", out.launcher, -1);
  const std::string* addr = find(env, "MASTER_ADDR");
  LOCKSTEP_CHECK(addr != nullptr || out.world_size == 1, "launcher 'pytorch': environment variable MASTER_ADDR is "
                 "not set", missing_hint(out.launcher));
  if (addr) out.master_addr = *addr;
  out.master_port = port_from(env, out.launcher, out.world_size > 1);
  out.use_agent_store = truthy(find(env, "TORCHELASTIC_USE_AGENT_STORE"));
  out.restart_count = out.use_agent_store ? required_int(env, "TORCHELASTIC_RESTART_COUNT", out.launcher)
                                          : optional_int(env, "TORCHELASTIC_RESTART_COUNT", out.launcher, 0);
  out.attempt = job_attempt(env);
  return out;
}

DistEnv from_slurm(const Environment& env) {
  DistEnv out = place_from(env, {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"});
  out.node_rank = optional_int(env, "SLURM_NODEID", out.launcher, -1);
  out.local_world_size = -1;
  if (const std::string* per_node = find(env, "SLURM_NTASKS_PER_NODE");
      per_node && per_node->find_first_not_of("0123456789") == std::string::npos) {
    out.local_world_size = static_cast<int>(parse_integer(*per_node, "SLURM_NTASKS_PER_NODE", out.launcher));
  } else if (const std::string* tasks = find(env, "SLURM_TASKS_PER_NODE"); tasks && out.node_rank >= 0) {
    auto counts = expand_slurm_tasks_per_node(*tasks);
    LOCKSTEP_CHECK(out.node_rank < static_cast<int>(counts.size()), "launcher 'slurm': SLURM_NODEID=", out.node_rank,
                   " but SLURM_TASKS_PER_NODE='", *tasks, "' lists ", counts.size(), " nodes");
    out.local_world_size = counts[static_cast<size_t>(out.node_rank)];
  }
  if (const std::string* addr = find(env, "MASTER_ADDR")) {
    out.master_addr = *addr;
  } else {
    const std::string* nodes = find(env, "SLURM_NODELIST");
    if (nodes == nullptr) nodes = find(env, "SLURM_JOB_NODELIST");
    LOCKSTEP_CHECK(nodes != nullptr || out.world_size == 1, "launcher 'slurm': neither MASTER_ADDR nor "
                   "SLURM_NODELIST is set, so the master host is unknown");
    if (nodes) {
      try {
        out.master_addr = expand_slurm_nodelist(*nodes).front();
      } catch (const Error& error) {
        LOCKSTEP_FAIL("launcher 'slurm': SLURM_NODELIST: ", error.what());
      }
    }
  }
  out.master_port = find(env, "MASTER_PORT") ? port_from(env, out.launcher, false) : slurm_job_port(env);
  return out;
}

DistEnv from_mpi(const Environment& env) {
  DistEnv out = place_from(env, {"mpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"});
  out.local_world_size = optional_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", out.launcher, -1);
  const std::string* addr = find(env, "MASTER_ADDR");
  out.meet_over_mpi = addr == nullptr && out.world_size > 1 && can_meet_over_mpi();
  LOCKSTEP_CHECK(addr != nullptr || out.world_size == 1 || out.meet_over_mpi, "launcher 'mpi': environment variable "
                 "MASTER_ADDR is not set; export it to rank 0's host (mpirun -x MASTER_ADDR=<host>), or build "
                 "lockstep with MPI (libopenmpi-dev) to have the ranks find each other over MPI");
  if (addr) out.master_addr = *addr;
  out.master_port = port_from(env, out.launcher, false);
  return out;
}

std::string auto_launcher(const Environment& env) {
  if (find(env, "TORCHELASTIC_RUN_ID") || (find(env, "RANK") && find(env, "WORLD_SIZE"))) return "pytorch";
  if (find(env, "OMPI_COMM_WORLD_RANK")) return "mpi";
  if (find(env, "SLURM_PROCID") && find(env, "SLURM_NTASKS")) return "slurm";
  return "none";
}

// None of the variables `launcher` would have set is present.
bool launcher_left_nothing(const std::string& launcher, const Environment& env) {
  static const std::map<std::string, std::vector<const char*>> variables{
      {"pytorch", {"RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID"}},
      {"slurm", {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"}},
      {"mpi", {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"}}};
  auto it = variables.find(launcher);
  if (it == variables.end()) return false;
  for (const char* name : it->second) {
    if (find(env, name)) return false;
  }
  return true;
}

// Splits at commas outside brackets.
std::vector<std::string> split_top_level(const std::string& text, const std::string& whole) {
  std::vector<std::string> parts;
  std::string current;
  int depth = 0;
  for (char c : text) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    LOCKSTEP_CHECK(depth >= 0 && depth <= 1, "nodelist '", whole, "': unbalanced or nested brackets");
    if (c == ',' && depth == 0) {
      parts.push_back(current);
      current.clear();
    } else {
      current += c;
    }
  }
  LOCKSTEP_CHECK(depth == 0, "nodelist '", whole, "': unclosed '['");
  parts.push_back(current);
  return parts;
}

std::string pad(long long value, size_t width) {
  std::string digits = std::to_string(value);
  if (digits.size() < width) digits.insert(0, width - digits.size(), '0');
  return digits;
}

bool all_digits(const std::string& text) {
  return !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
}

std::vector<std::string> expand_range_list(const std::string& inside, const std::string& whole) {
  std::vector<std::string> values;
  size_t start = 0;
  while (start <= inside.size()) {
    size_t comma = inside.find(',', start);
    std::string item = inside.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    size_t dash = item.find('-');
    std::string low = item.substr(0, dash);
    std::string high = dash == std::string::npos ? low : item.substr(dash + 1);
    LOCKSTEP_CHECK(all_digits(low) && all_digits(high) && low.size() <= 18 && high.size() <= 18, "nodelist '", whole,
                   "': '", item, "' is not a number or a range like 01-04");
    long long a = std::stoll(low), b = std::stoll(high);
    LOCKSTEP_CHECK(a <= b, "nodelist '", whole, "': range '", item, "' runs backwards");
    LOCKSTEP_CHECK(b - a < 100000, "nodelist '", whole, "': range '", item, "' is implausibly long");
    for (long long v = a; v <= b; ++v) values.push_back(pad(v, low.size()));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return values;
}

}  // namespace

Environment current_environment() {
  Environment env;
  for (char** entry = environ; entry && *entry; ++entry) {
    std::string line(*entry);
    auto eq = line.find('=');
    if (eq != std::string::npos) env[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return env;
}

DistEnv detect_dist_env(const std::string& launcher) { return detect_dist_env(launcher, current_environment()); }

DistEnv detect_dist_env(const std::string& launcher, const Environment& env) {
  std::string which = launcher == "auto" ? auto_launcher(env) : launcher;
  if (which != "none" && which != "auto" && launcher_left_nothing(which, env)) {
    DistEnv alone;
    alone.absent_launcher = which;
    return alone;
  }
  DistEnv out;
  if (which == "pytorch") {
    out = from_pytorch(env);
  } else if (which == "slurm") {
    out = from_slurm(env);
  } else if (which == "mpi") {
    out = from_mpi(env);
  } else {
    LOCKSTEP_CHECK(which == "none", "unknown launcher '", launcher, "' (expected auto, pytorch, slurm, mpi or none)");
    out.launcher = "none";
  }
  validate(out);
  return out;
}

int restart_count(const Environment& env) {
  const int count = optional_int(env, "TORCHELASTIC_RESTART_COUNT", "pytorch", 0);
  LOCKSTEP_CHECK(count >= 0, "TORCHELASTIC_RESTART_COUNT=", count, " is negative");
  return count;
}

int job_attempt(const Environment& env) {
  const int round = optional_int(env, "LOCKSTEP_RDZV_ROUND", "pytorch", -1);
  // A SLURM job requeued (after a preemption, or by auto_requeue) runs its
  // batch script again with SLURM_RESTART_COUNT one higher.
  const int requeues = optional_int(env, "SLURM_RESTART_COUNT", "slurm", 0);
  LOCKSTEP_CHECK(requeues >= 0, "SLURM_RESTART_COUNT=", requeues, " is negative");
  return (round >= 0 ? round : restart_count(env)) + requeues;
}

std::vector<std::string> gloo_socket_interfaces(const Environment& env) {
  std::vector<std::string> names;
  const std::string* value = find(env, "GLOO_SOCKET_IFNAME");
  if (value == nullptr) return names;
  size_t start = 0;
  while (start <= value->size()) {
    const size_t comma = value->find(',', start);
    std::string name = value->substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!name.empty()) names.push_back(name);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return names;
}

int launched_world_size(const Environment& env) {
  for (const char* name : {"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS"}) {
    const std::string* value = find(env, name);
    if (value && all_digits(*value) && value->size() < 9 && std::stoi(*value) > 1) return std::stoi(*value);
  }
  return 1;
}

std::vector<std::string> expand_slurm_nodelist(const std::string& nodelist) {
  std::string trimmed = nodelist;
  trimmed.erase(0, trimmed.find_first_not_of(" \t\n"));
  trimmed.erase(trimmed.find_last_not_of(" \t\n") + 1);
  LOCKSTEP_CHECK(!trimmed.empty(), "nodelist is empty");
  std::vector<std::string> hosts;
  for (const std::string& token : split_top_level(trimmed, nodelist)) {
    LOCKSTEP_CHECK(!token.empty(), "nodelist '", nodelist, "': empty host name");
    std::vector<std::string> names{""};
    size_t i = 0;
    while (i < token.size()) {
      if (token[i] == '[') {
        size_t close = token.find(']', i);
        auto values = expand_range_list(token.substr(i + 1, close - i - 1), nodelist);
        std::vector<std::string> product;
        for (const auto& prefix : names) {
          for (const auto& value : values) product.push_back(prefix + value);
        }
        names.swap(product);
        i = close + 1;
      } else {
        size_t next = token.find('[', i);
        std::string literal = token.substr(i, next == std::string::npos ? std::string::npos : next - i);
        LOCKSTEP_CHECK(literal.find(']') == std::string::npos, "nodelist '", nodelist, "': stray ']'");
        for (auto& name : names) name += literal;
        i = next == std::string::npos ? token.size() : next;
      }
    }
    hosts.insert(hosts.end(), names.begin(), names.end());
  }
  return hosts;
}

std::vector<int> expand_slurm_tasks_per_node(const std::string& tasks) {
  std::vector<int> counts;
  size_t start = 0;
  while (true) {
    size_t comma = tasks.find(',', start);
    std::string item = tasks.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    std::string count = item, repeat = "1";
    size_t paren = item.find("(x");
    if (paren != std::string::npos) {
      LOCKSTEP_CHECK(item.back() == ')', "SLURM_TASKS_PER_NODE '", tasks, "': '", item, "' is not N or N(xM)");
      count = item.substr(0, paren);
      repeat = item.substr(paren + 2, item.size() - paren - 3);
    }
    LOCKSTEP_CHECK(all_digits(count) && all_digits(repeat) && count.size() < 9 && repeat.size() < 9,
                   "SLURM_TASKS_PER_NODE '", tasks, "': '", item, "' is not N or N(xM)");
    for (int r = 0; r < std::stoi(repeat); ++r) counts.push_back(std::stoi(count));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return counts;
}

}  // namespace lockstep
