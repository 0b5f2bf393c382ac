#include "lockstep/checkpoint/pt_file.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <string_view>

#include "lockstep/checkpoint/torch_pickle.h"
#include "lockstep/checkpoint/zip_archive.h"
#include "lockstep/core/atomic_file.h"
#include "lockstep/core/error.h"
#include "lockstep/core/read_file.h"

namespace lockstep {
namespace {

constexpr char kZipMagic[] = "PK\x03\x04";

// The pickle of a torch.save file's bytes, its storages loaded.
Unpickled unpickle_pt_bytes(const std::string& bytes, const std::string& source) {
  if (bytes.size() < 4 || std::memcmp(bytes.data(), kZipMagic, 4) != 0) {
    const bool legacy = bytes.size() >= 2 && static_cast<uint8_t>(bytes[0]) == 0x80;
    LOCKSTEP_FAIL(source, legacy ? ": a torch.save file in the legacy format (PyTorch before 1.6, or "
                                   "_use_new_zipfile_serialization=False); load it and torch.save it again "
                                   "with a current PyTorch"
                                 : ": not a torch.save file (it does not start as a zip archive)");
  }
  const ZipArchive archive(bytes, source);
  LOCKSTEP_CHECK(!archive.has("constants.pkl"), source,
                 ": a TorchScript archive (torch.jit.save), not a state dict: save the module's state_dict() with "
                 "torch.save");
  LOCKSTEP_CHECK(archive.has("data.pkl"), source, ": a zip archive without data.pkl, not a torch.save file");
  if (archive.has("byteorder")) {
    const std::string_view order = archive.read("byteorder");
    LOCKSTEP_CHECK(order == "little", source, ": written on a ", order, "-endian machine; only little-endian files "
                   "are read");
  }
  StorageLoader load_storage = [&](const std::string& key, c10::ScalarType type, int64_t numel) {
    const std::string name = "data/" + key;
    LOCKSTEP_CHECK(archive.has(name), source, ": storage ", key, " is missing from the archive");
    const std::string_view data = archive.read(name);
    const size_t needed = static_cast<size_t>(numel) * c10::elementSize(type);
    LOCKSTEP_CHECK(data.size() >= needed, source, ": storage ", key, " holds ", data.size(), " bytes, its ", numel,
                   " ", c10::toString(type), " elements need ", needed);
    torch::Tensor storage = torch::empty({numel}, torch::TensorOptions().dtype(type));
    if (needed > 0) std::memcpy(storage.data_ptr(), data.data(), needed);
    return storage;
  };
  return unpickle_torch_save(std::string(archive.read("data.pkl")), load_storage, source);
}

// The bytes torch.save(root) writes: libtorch's pickle_save, except that
// containers are not tagged with their TorchScript type: the tag is a call to
// torch.jit._pickle.restore_type_tag, which torch.load refuses by default
// since PyTorch 2.6 (weights_only=True). Untagged, the file holds only what
// weights_only allows: a dict of tensors, or a tensor.
std::string torch_save_bytes(const c10::IValue& root) {
  std::vector<char> pickled;
  torch::jit::Pickler pickler([&pickled](const char* data, size_t size) { pickled.insert(pickled.end(), data, data + size); },
                              /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
                              /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(root);
  pickler.stop();
  std::string bytes;
  {
    caffe2::serialize::PyTorchStreamWriter archive([&bytes](const void* data, size_t size) {
      bytes.append(static_cast<const char*>(data), size);
      return size;
    });
    torch::jit::writeArchiveAndTensors("data", pickled.data(), pickled.size(), pickler.tensorData(), archive);
    archive.writeEndOfFile();
  }
  return bytes;
}

}  // namespace

bool is_torch_save_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char head[4] = {0, 0, 0, 0};
  in.read(head, 4);
  return in.gcount() == 4 && std::memcmp(head, kZipMagic, 4) == 0;
}

std::map<std::string, torch::Tensor> read_pt_state_dict(const std::string& path) {
  return read_pt_state_dict_from_bytes(read_file(path), path);
}

std::map<std::string, torch::Tensor> read_pt_state_dict_from_bytes(const std::string& bytes,
                                                                   const std::string& source) {
  const Unpickled file = unpickle_pt_bytes(bytes, source);
  return find_state_dict(*file.root, source);
}

torch::Tensor read_pt_tensor_from_bytes(const std::string& bytes, const std::string& source) {
  const Unpickled file = unpickle_pt_bytes(bytes, source);
  LOCKSTEP_CHECK(file.root->kind == PickleValue::Kind::kTensor, source, ": holds ", file.root->describe(),
                 ", not a tensor (torch.save(tensor))");
  return file.root->tensor;
}

void write_pt_state_dict(const std::map<std::string, torch::Tensor>& weights, const std::string& path) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [name, tensor] : weights) dict.insert(name, tensor.detach().to(torch::kCPU).contiguous());
  write_file_atomically(path, torch_save_bytes(c10::IValue(dict)));
}

std::string pt_tensor_bytes(const torch::Tensor& tensor) {
  return torch_save_bytes(c10::IValue(tensor.detach().to(torch::kCPU).contiguous()));
}

std::string pt_object_bytes(const c10::IValue& value) {
  LOCKSTEP_CHECK(!value.isTensor(), "pt_object_bytes: a tensor is written by pt_tensor_bytes");
  return torch_save_bytes(value);
}

}  // namespace lockstep
