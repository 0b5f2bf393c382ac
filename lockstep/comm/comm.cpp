#include "lockstep/comm/comm.h"

#include <cstring>
#include <random>
#include <sstream>

#include "lockstep/core/error.h"
#include "lockstep/comm/init.h"

namespace lockstep {

namespace {

std::shared_ptr<ProcessGroup> resolve(const std::shared_ptr<ProcessGroup>& group) { return group ? group : world(); }

torch::Tensor to_bytes(const std::string& object) {
  auto tensor = torch::empty({static_cast<int64_t>(object.size())}, torch::kUInt8);
  if (!object.empty()) std::memcpy(tensor.data_ptr<uint8_t>(), object.data(), object.size());
  return tensor;
}

std::string from_bytes(const torch::Tensor& tensor) {
  auto contiguous = tensor.contiguous();
  return std::string(reinterpret_cast<const char*>(contiguous.data_ptr<uint8_t>()),
                     static_cast<size_t>(contiguous.numel()));
}

std::vector<nlohmann::json> parse_all(const std::vector<std::string>& texts) {
  std::vector<nlohmann::json> objects;
  objects.reserve(texts.size());
  for (const auto& text : texts) objects.push_back(nlohmann::json::parse(text));
  return objects;
}

uint64_t key_hash(const std::map<std::string, double>& values) {
  uint64_t hash = 1469598103934665603ULL;  // FNV-1a
  for (const auto& [key, value] : values) {
    for (char c : key) hash = (hash ^ static_cast<unsigned char>(c)) * 1099511628211ULL;
    hash = (hash ^ 0xffu) * 1099511628211ULL;
  }
  return hash;
}

}  // namespace

int get_rank() { return is_initialized() ? world()->rank() : 0; }
int get_world_size() { return is_initialized() ? world()->size() : 1; }
int get_local_rank() { return is_initialized() ? local_group()->rank() : 0; }
int get_local_size() { return is_initialized() ? local_group()->size() : 1; }
bool is_main_process() { return get_rank() == 0; }

void synchronize() {
  if (!is_initialized() || world()->size() == 1) return;
  world()->barrier();
}

std::vector<std::string> all_gather_object(const std::string& object, const std::shared_ptr<ProcessGroup>& group) {
  auto g = resolve(group);
  if (g->size() == 1) return {object};
  std::vector<torch::Tensor> outs;
  g->all_gather(outs, to_bytes(object));
  std::vector<std::string> objects;
  for (const auto& out : outs) objects.push_back(from_bytes(out));
  return objects;
}

std::vector<nlohmann::json> all_gather_object(const nlohmann::json& object,
                                              const std::shared_ptr<ProcessGroup>& group) {
  return parse_all(all_gather_object(object.dump(), group));
}

std::vector<std::string> gather_object(const std::string& object, int dst, const std::shared_ptr<ProcessGroup>& group) {
  auto g = resolve(group);
  LOCKSTEP_CHECK(dst >= 0 && dst < g->size(), "gather_object: dst ", dst, " is not in group '", g->name(), "' of ",
                 g->size(), " ranks");
  // Objects are small (metrics, evaluation results): the ring all-gather is
  // as fast as a gather here and keeps one code path.
  auto all = all_gather_object(object, g);
  if (g->rank() != dst) return {};
  return all;
}

std::vector<nlohmann::json> gather_object(const nlohmann::json& object, int dst,
                                          const std::shared_ptr<ProcessGroup>& group) {
  return parse_all(gather_object(object.dump(), dst, group));
}

std::string broadcast_object(const std::string& object, int src, const std::shared_ptr<ProcessGroup>& group) {
  auto g = resolve(group);
  LOCKSTEP_CHECK(src >= 0 && src < g->size(), "broadcast_object: src ", src, " is not in group '", g->name(),
                 "' of ", g->size(), " ranks");
  if (g->size() == 1) return object;
  auto length = torch::tensor({static_cast<int64_t>(object.size())}, torch::kLong);
  g->broadcast(length, src);
  auto bytes = g->rank() == src ? to_bytes(object) : torch::empty({length.item<int64_t>()}, torch::kUInt8);
  if (bytes.numel() > 0) g->broadcast(bytes, src);
  return g->rank() == src ? object : from_bytes(bytes);
}

nlohmann::json broadcast_object(const nlohmann::json& object, int src, const std::shared_ptr<ProcessGroup>& group) {
  auto g = resolve(group);
  return nlohmann::json::parse(broadcast_object(g->rank() == src ? object.dump() : std::string(), src, g));
}

std::map<std::string, double> reduce_dict(const std::map<std::string, double>& values, bool average,
                                          const std::shared_ptr<ProcessGroup>& group) {
  if (!group && !is_initialized()) return values;
  auto g = resolve(group);
  if (g->size() == 1) return values;
  // Values are matched by position, so every rank must hold the same keys.
  auto hash = torch::tensor({static_cast<int64_t>(key_hash(values))}, torch::kLong);
  auto hashes = torch::empty({g->size()}, torch::kLong);
  g->all_gather_into_tensor(hashes, hash);
  if (!hashes.eq(hash).all().item<bool>()) {
    nlohmann::json keys = nlohmann::json::array();
    for (const auto& entry : values) keys.push_back(entry.first);
    auto all = all_gather_object(keys, g);
    std::ostringstream detail;
    for (int r = 0; r < g->size(); ++r) detail << (r ? "; " : "") << "rank " << g->global_rank(r) << ": " << all[r].dump();
    LOCKSTEP_FAIL("reduce_dict on group '", g->name(), "': ranks hold different keys (", detail.str(), ")");
  }
  if (values.empty()) return values;  // every rank agreed on no keys
  auto tensor = torch::empty({static_cast<int64_t>(values.size())}, torch::kDouble);
  int64_t i = 0;
  for (const auto& entry : values) tensor[i++] = entry.second;
  g->all_reduce(tensor, average ? ReduceOp::kAvg : ReduceOp::kSum);
  std::map<std::string, double> reduced;
  i = 0;
  auto data = tensor.data_ptr<double>();
  for (const auto& entry : values) reduced[entry.first] = data[i++];
  return reduced;
}

int64_t shared_random_seed() {
  std::random_device device;
  int64_t seed = static_cast<int64_t>(device() % (1u << 31));
  if (!is_initialized() || world()->size() == 1) return seed;
  auto tensor = torch::tensor({seed}, torch::kLong);
  world()->broadcast(tensor, 0);
  return tensor.item<int64_t>();
}

}  // namespace lockstep
