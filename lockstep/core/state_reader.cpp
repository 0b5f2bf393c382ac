#include "lockstep/core/state_reader.h"

#include "lockstep/core/error.h"

namespace lockstep {
namespace {

const nlohmann::json& empty_object() {
  static const nlohmann::json empty = nlohmann::json::object();
  return empty;
}

}  // namespace

int64_t TensorEntry::numel() const {
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  return count;
}

StateReader::StateReader(std::shared_ptr<const Backend> backend)
    : StateReader(backend, "", &backend->values()) {}

StateReader::StateReader(std::shared_ptr<const Backend> backend, std::string prefix, const nlohmann::json* values)
    : backend_(std::move(backend)), prefix_(std::move(prefix)), values_(values) {}

std::vector<std::string> StateReader::keys() const {
  std::vector<std::string> names;
  const auto& index = backend_->index();
  for (auto it = index.lower_bound(prefix_); it != index.end(); ++it) {
    if (it->first.compare(0, prefix_.size(), prefix_) != 0) break;
    names.push_back(it->first.substr(prefix_.size()));
  }
  return names;
}

bool StateReader::contains(const std::string& key) const { return backend_->index().count(full_key(key)) != 0; }

const TensorEntry& StateReader::entry(const std::string& key) const {
  auto found = backend_->index().find(full_key(key));
  LOCKSTEP_CHECK(found != backend_->index().end(), source(), ": holds no tensor '", full_key(key), "'");
  return found->second;
}

torch::Tensor StateReader::read(const std::string& key) const {
  const TensorEntry& found = entry(key);
  return backend_->read_elements(full_key(key), 0, found.numel()).view(found.shape);
}

torch::Tensor StateReader::read_elements(const std::string& key, int64_t begin, int64_t count) const {
  const TensorEntry& found = entry(key);
  LOCKSTEP_CHECK(begin >= 0 && count >= 0 && begin + count <= found.numel(), source(), ": elements [", begin, ", ",
                 begin + count, ") of '", full_key(key), "' asked for, but it holds ", found.numel());
  return backend_->read_elements(full_key(key), begin, count);
}

StateReader StateReader::part(const std::string& prefix) const {
  const nlohmann::json* values = &empty_object();
  if (values_->is_object() && values_->contains(prefix)) values = &values_->at(prefix);
  return StateReader(backend_, prefix_ + prefix + "/", values);
}

}  // namespace lockstep
