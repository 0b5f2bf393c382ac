// StateReader: a State on disk, read on demand. Its values and the index of
// its tensors (dtype and shape) are at hand once it is open; a tensor, or a
// run of its elements, is read when asked. A rank that needs a slice of a
// large tensor reads that slice, not the tensor.
//
//   lockstep::StateReader file = lockstep::open_checkpoint_file("run/iter_99.ckpt.rank1-of-2.shard");
//   lockstep::StateReader model = file.part("model");           // what State::put("model", ...) stored
//   torch::Tensor mean = model.read("buffers/bn.running_mean");   // whole, in its shape
//   torch::Tensor some = model.read_elements("shards/flat_param", 1000, 500);   // flattened [1000, 1500)
//   uint64_t bytes = file.bytes_read();                           // tensor bytes read so far, every part
//
// Backends (checkpoint/checkpoint_file.h) verify what they read.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/types.h>


namespace lockstep {

struct TensorEntry {
  c10::ScalarType dtype = torch::kFloat32;
  std::vector<int64_t> shape;
  int64_t numel() const;
};

class StateReader {
 public:
  class Backend {
   public:
    virtual ~Backend() = default;
    virtual const std::string& source() const = 0;  // for messages: the file's path
    virtual const nlohmann::json& values() const = 0;
    virtual const std::map<std::string, TensorEntry>& index() const = 0;  // by full key
    // Elements [begin, begin + count) of the flattened tensor `key` (a full key, in the index).
    virtual torch::Tensor read_elements(const std::string& key, int64_t begin, int64_t count) const = 0;
    virtual uint64_t bytes_read() const = 0;
  };

  explicit StateReader(std::shared_ptr<const Backend> backend);

  const std::string& source() const { return backend_->source(); }
  // This part's values (an empty object when the part stored none).
  const nlohmann::json& values() const { return *values_; }
  // This part's tensor names, relative to it.
  std::vector<std::string> keys() const;
  bool contains(const std::string& key) const;
  // An error naming the file and the key when absent.
  const TensorEntry& entry(const std::string& key) const;
  torch::Tensor read(const std::string& key) const;
  // Elements [begin, begin + count) of the flattened tensor; an error naming
  // the file and the key when they are not all inside it.
  torch::Tensor read_elements(const std::string& key, int64_t begin, int64_t count) const;
  // The part stored under `prefix` (State::put's); empty when absent.
  StateReader part(const std::string& prefix) const;
  // Tensor bytes read from the backend so far, by every part of it.
  uint64_t bytes_read() const { return backend_->bytes_read(); }

 private:
  StateReader(std::shared_ptr<const Backend> backend, std::string prefix, const nlohmann::json* values);
  std::string full_key(const std::string& key) const { return prefix_ + key; }

  std::shared_ptr<const Backend> backend_;
  std::string prefix_;                // "" or "model/" or "optim_wrapper/optimizer/"
  const nlohmann::json* values_;      // inside the backend's values (or kEmpty)
};

}  // namespace lockstep
