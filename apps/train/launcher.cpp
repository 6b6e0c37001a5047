#include "apps/train/launcher.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include <torch/csrc/distributed/c10d/Store.hpp>

namespace tt {

// ---------------------------------------------------------------------------------------------------
// Launcher variables
// ---------------------------------------------------------------------------------------------------

EnvLookup process_env() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (!value) return std::nullopt;
    return std::string(value);
  };
}

namespace {

// The variables one launcher sets, by role.
struct LauncherNames {
  const char* source;
  const char* rank;
  const char* world_size;
  const char* local_rank;
  const char* local_world_size;
  bool port_required;  // launch.sh and torchrun always set MASTER_PORT; mpirun and srun know nothing of it
};

constexpr LauncherNames kTorchrun{"torchrun-style", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", true};
constexpr LauncherNames kOpenMpi{"Open MPI",
                                 "OMPI_COMM_WORLD_RANK",
                                 "OMPI_COMM_WORLD_SIZE",
                                 "OMPI_COMM_WORLD_LOCAL_RANK",
                                 "OMPI_COMM_WORLD_LOCAL_SIZE",
                                 false};
// Slurm's tasks-per-node variables come as "2(x3),1": the local count is left unknown.
constexpr LauncherNames kSlurm{"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr, false};

std::string required(const EnvLookup& env, const char* name, const LauncherNames& l, const std::string& why) {
  const auto value = env(name);
  if (!value || value->empty())
    throw ConfigError("environment variable " + std::string(name) + " is " + (value ? "empty" : "not set") + ": " +
                      l.source + " data parallel (" + l.rank + " or " + l.world_size + " is set) needs it: " + why);
  return *value;
}

int parse_int(const std::string& name, const std::string& text, long min, long max, const std::string& allowed) {
  char* end = nullptr;
  errno = 0;
  const long value = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno == ERANGE || value < min || value > max)
    throw ConfigError("environment variable " + name + " = \"" + text + "\" is not allowed: must be " + allowed);
  return static_cast<int>(value);
}

}  // namespace

DistributedEnv parse_distributed_env(const EnvLookup& env) {
  const LauncherNames* launcher = nullptr;
  for (const LauncherNames* l : {&kTorchrun, &kOpenMpi, &kSlurm})
    if (env(l->rank) || env(l->world_size)) {
      launcher = l;
      break;
    }
  DistributedEnv out;
  if (!launcher) return out;
  const LauncherNames& l = *launcher;
  out.enabled = true;
  out.source = l.source;
  const int int_max = std::numeric_limits<int>::max();
  out.world_size = parse_int(l.world_size, required(env, l.world_size, l, "the number of processes"), 1, int_max,
                             "an integer >= 1");
  out.rank = parse_int(l.rank, required(env, l.rank, l, "this process's index"), 0, out.world_size - 1,
                       "an integer in [0, " + std::string(l.world_size) + " = " + std::to_string(out.world_size) +
                           ")");
  out.local_rank = parse_int(l.local_rank, required(env, l.local_rank, l, "this process's GPU on its host"), 0,
                             out.world_size - 1, "an integer in [0, " + std::to_string(out.world_size) + ")");
  if (l.local_world_size && env(l.local_world_size)) {
    out.local_world_size =
        parse_int(l.local_world_size, *env(l.local_world_size), 1, out.world_size,
                  "an integer in [1, " + std::string(l.world_size) + " = " + std::to_string(out.world_size) + "]");
    if (out.local_rank >= out.local_world_size)
      throw ConfigError("environment variable " + std::string(l.local_rank) + " = " + std::to_string(out.local_rank) +
                        " is not allowed: must be below " + l.local_world_size + " = " +
                        std::to_string(out.local_world_size));
  }
  out.master_addr = required(env, "MASTER_ADDR", l,
                             "the host name or address of rank 0's host, which serves the rendezvous "
                             "(MASTER_ADDR=127.0.0.1 on one host; scripts/launch.sh sets it)");
  const auto port = env("MASTER_PORT");
  if (port || l.port_required)
    out.master_port = parse_int("MASTER_PORT", required(env, "MASTER_PORT", l, "the rendezvous port on MASTER_ADDR"),
                                1, 65535, "a TCP port in [1, 65535]");
  else
    out.master_port = kDefaultMasterPort;
  return out;
}

// ---------------------------------------------------------------------------------------------------
// Sharding
// ---------------------------------------------------------------------------------------------------

namespace {

class ShardedSource final : public TokenSource {
 public:
  ShardedSource(std::unique_ptr<TokenSource> global, int64_t batch, int rank, int world)
      : global_(std::move(global)), batch_(batch), rank_(rank), world_(world) {}

  void fill(torch::Tensor& rows) override {
    TORCH_CHECK(rows.size(0) % batch_ == 0, "ShardedSource: ", rows.size(0), " rows are not whole steps of batch ",
                batch_);
    const int64_t steps = rows.size(0) / batch_;
    auto global = torch::empty({steps * batch_ * world_, rows.size(1)}, rows.options());
    global_->fill(global);
    rows.copy_(global.view({steps, batch_ * world_, rows.size(1)})
                   .narrow(1, rank_ * batch_, batch_)
                   .reshape({steps * batch_, rows.size(1)}));
  }
  std::string describe() const override {
    return global_->describe() + "; global batch " + std::to_string(batch_ * world_) + ", rank " +
           std::to_string(rank_) + " of " + std::to_string(world_) + " trains rows [" + std::to_string(rank_ * batch_) +
           ", " + std::to_string((rank_ + 1) * batch_) + ") of each";
  }

 private:
  std::unique_ptr<TokenSource> global_;
  int64_t batch_;
  int rank_, world_;
};

}  // namespace

std::unique_ptr<TokenSource> make_sharded_source(std::unique_ptr<TokenSource> global, int64_t per_rank_batch,
                                                 int rank, int world_size) {
  TORCH_CHECK(per_rank_batch >= 1 && world_size >= 1 && rank >= 0 && rank < world_size,
              "make_sharded_source: batch ", per_rank_batch, ", rank ", rank, ", world size ", world_size);
  return std::make_unique<ShardedSource>(std::move(global), per_rank_batch, rank, world_size);
}

// ---------------------------------------------------------------------------------------------------
// Start-up agreement
// ---------------------------------------------------------------------------------------------------

std::vector<std::string> differing_fields(const nlohmann::json& mine, const nlohmann::json& reference,
                                          const std::string& prefix) {
  std::vector<std::string> out;
  if (mine.is_object() && reference.is_object()) {
    for (const auto& [key, value] : mine.items()) {
      const std::string path = prefix.empty() ? key : prefix + "." + key;
      if (!reference.contains(key)) {
        out.push_back(path + " (" + value.dump() + " here, absent on rank 0)");
        continue;
      }
      const auto nested = differing_fields(value, reference.at(key), path);
      out.insert(out.end(), nested.begin(), nested.end());
    }
    for (const auto& [key, value] : reference.items())
      if (!mine.contains(key))
        out.push_back((prefix.empty() ? key : prefix + "." + key) + " (absent here, " + value.dump() + " on rank 0)");
    return out;
  }
  if (mine != reference) out.push_back(prefix + " (" + mine.dump() + " here, " + reference.dump() + " on rank 0)");
  return out;
}

std::string run_fingerprint(const nlohmann::json& run) {
  uint64_t hash = 1469598103934665603ull;  // FNV-1a, 64 bit
  for (const unsigned char c : run.dump()) {
    hash ^= c;
    hash *= 1099511628211ull;
  }
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(hash));
  return text;
}

void check_same_run(c10d::Store& store, int rank, int world_size, const nlohmann::json& run) {
  const std::string key_prefix = "tt/run/";
  const std::string text = run.dump();
  store.set(key_prefix + std::to_string(rank), std::vector<uint8_t>(text.begin(), text.end()));
  auto fetch = [&](int r) {
    const auto bytes = store.get(key_prefix + std::to_string(r));
    return nlohmann::json::parse(std::string(bytes.begin(), bytes.end()));
  };
  const nlohmann::json reference = fetch(0);
  std::string problems;
  for (int r = 1; r < world_size; ++r) {
    const nlohmann::json other = r == rank ? run : fetch(r);
    if (other == reference) continue;
    std::string fields;
    for (const auto& f : differing_fields(other, reference)) fields += (fields.empty() ? "" : "; ") + f;
    problems += "\n  rank " + std::to_string(r) + " (fingerprint " + run_fingerprint(other) + ") differs in " +
                fields;
  }
  // Rank 0 serves the store: it waits until every rank has read, so none of them loses the store before it
  // could report the mismatch itself.
  store.set(key_prefix + "read/" + std::to_string(rank), std::vector<uint8_t>{1});
  if (rank == 0) {
    std::vector<std::string> read;
    for (int r = 0; r < world_size; ++r) read.push_back(key_prefix + "read/" + std::to_string(r));
    store.wait(read);
  }
  if (!problems.empty())
    throw ConfigError("the ranks were started with different runs; every rank must run the same stage, config and "
                      "flags (rank 0's fingerprint " + run_fingerprint(reference) + "):" + problems +
                      "\n  (\"here\" is that rank's value)");
}

void check_port_free(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error(std::string("cannot open a socket to check MASTER_PORT: ") + std::strerror(errno));
  const int yes = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);  // as the store's server does
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  address.sin_port = htons(static_cast<uint16_t>(port));
  const int rc = ::bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address);
  const int error = errno;
  ::close(fd);
  if (rc == 0) return;
  if (error == EADDRINUSE)
    throw ConfigError("MASTER_PORT = " + std::to_string(port) +
                      " is not allowed: the port is in use on this host, where rank 0 serves the rendezvous; choose "
                      "a free port (scripts/launch.sh --master-port P, or MASTER_PORT=P)");
  throw std::runtime_error("cannot bind MASTER_PORT = " + std::to_string(port) + " on this host: " +
                           std::strerror(error));
}

const char* to_string(GradientSync sync) { return sync == GradientSync::kReducer ? "reducer" : "layers"; }

GradientSync parse_gradient_sync(const std::string& value) {
  if (value == "reducer") return GradientSync::kReducer;
  if (value == "layers") return GradientSync::kLayers;
  throw ConfigError("--dp-sync '" + value + "' is not allowed: must be reducer (c10d's Reducer, eager) or layers " +
                    "(an all-reduce per layer, captured in a graphed stage's graph)");
}

const char* to_string(EmbeddingGradExchange exchange) {
  return exchange == EmbeddingGradExchange::kRows ? "rows" : "dense";
}

const char* to_string(ZeroGather gather) { return gather == ZeroGather::kForward ? "forward" : "update"; }

ZeroGather parse_zero_gather(const std::string& value) {
  if (value == "forward") return ZeroGather::kForward;
  if (value == "update") return ZeroGather::kUpdate;
  throw ConfigError("--zero-gather '" + value + "' is not allowed: must be forward (most layers' weights in the next " +
                    "step, before that layer's forward) or update (after each layer's update)");
}

bool graph_mixing_off(const char* value) {
  if (value == nullptr || *value == '\0') return false;
  errno = 0;
  const long long parsed = std::strtoll(value, nullptr, 0);  // as NCCL's ncclLoadParam reads it
  return errno == 0 && parsed == 0;
}

EmbeddingGradExchange parse_embedding_grad_exchange(const std::string& value) {
  if (value == "rows") return EmbeddingGradExchange::kRows;
  if (value == "dense") return EmbeddingGradExchange::kDense;
  throw ConfigError("--dp-embedding-grad '" + value + "' is not allowed: must be rows (the rows the step's tokens " +
                    "touched, all-gathered with their token ids) or dense (the whole gradient averaged)");
}

}  // namespace tt
