// A reader for the pickle inside a torch.save file (its data.pkl), restricted
// to what state dicts and the checkpoints around them hold: dicts
// (OrderedDict included), lists, tuples, strings, numbers, booleans, None and
// tensors. Any other class -- a pickled nn.Module, numpy scalars in a
// checkpoint's meta, a TorchScript object, torch.distributed.checkpoint's
// Metadata dataclasses -- becomes an object that names its class and keeps
// its constructor arguments and BUILD state as plain values, but is never
// instantiated: unlike Python's pickle, reading a file runs no code. Every
// read is bounds-checked (the fuzz target lockstep/fuzz/pt_fuzzer.cpp feeds it
// arbitrary bytes).
//
//   lockstep::StorageLoader storages = [&](const std::string& key, c10::ScalarType type, int64_t numel) {
//     return tensor_from_record("data/" + key, type, numel);   // see pt_file.cpp
//   };
//   lockstep::Unpickled file = lockstep::unpickle_torch_save(pickle_bytes, storages, "weights.pt");
//   std::map<std::string, torch::Tensor> weights = lockstep::find_state_dict(*file.root, "weights.pt");
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/types.h>

namespace lockstep {

struct PickleValue {
  enum class Kind {
    kNone, kBool, kInt, kFloat, kString, kBytes, kTuple, kList, kDict, kTensor,
    kGlobal,   // a class or function named by the pickle (text)
    kStorage,  // a tensor storage (tensor, 1-D)
    kObject,   // an instance of a class this reader does not build (text: its class)
  };
  Kind kind = Kind::kNone;
  bool boolean = false;
  int64_t integer = 0;
  double real = 0;
  std::string text;  // kString, kBytes; kGlobal, kObject: "module.name"
  // Children point into the Unpickled arena (a hostile pickle can build
  // cycles, which shared ownership would leak).
  std::vector<PickleValue*> items;                                   // kTuple, kList
  // kObject: the argument tuple NEWOBJ or REDUCE gave its class (shared, not
  // copied: a hostile pickle reusing one big tuple costs nothing more), and
  // what BUILD gave it (a dataclass's attribute dict, a __setstate__ tuple).
  PickleValue* args = nullptr;
  PickleValue* state = nullptr;
  std::vector<std::pair<PickleValue*, PickleValue*>> entries;        // kDict, in order
  torch::Tensor tensor;  // kTensor; kStorage: the whole storage, 1-D

  // "a dict of 3 entries", "an int", "a tensor float32 [3, 2]", ...
  std::string describe() const;
};

// The bytes of storage `key` (data/<key> in the archive) as a 1-D tensor of
// `numel` elements of `type`; throws when the record is missing or short.
using StorageLoader = std::function<torch::Tensor(const std::string& key, c10::ScalarType type, int64_t numel)>;

// Every value of one pickle, and its result.
struct Unpickled {
  std::vector<std::unique_ptr<PickleValue>> arena;
  PickleValue* root = nullptr;
};

// Runs the pickle machine over `pickle`. Errors name `source` and the byte offset.
Unpickled unpickle_torch_save(const std::string& pickle, const StorageLoader& load_storage, const std::string& source);
// The same for a pickle that is not a torch.save file's (no storages: a
// persistent id is an error), such as a DCP checkpoint's .metadata.
Unpickled unpickle_plain(const std::string& pickle, const std::string& source);

// The state dict in a loaded file: the root itself when it maps names to
// tensors, else its "state_dict", "model", "model_state_dict" or "module"
// entry (mmengine's, detectron2's and Lightning's checkpoints). Otherwise an
// error naming `source` and what the root holds.
std::map<std::string, torch::Tensor> find_state_dict(const PickleValue& root, const std::string& source);

}  // namespace lockstep
