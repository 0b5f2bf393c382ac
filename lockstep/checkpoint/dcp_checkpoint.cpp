#include "lockstep/checkpoint/dcp_checkpoint.h"

#include <cerrno>
#include <cstring>
#include <algorithm>
#include <filesystem>
#include <set>
#include <fstream>
#include <utility>
#include <vector>

#include "lockstep/checkpoint/internal/dcp_format.h"
#include "lockstep/checkpoint/pt_file.h"
#include "lockstep/checkpoint/torch_pickle.h"
#include "lockstep/checkpoint/zip_archive.h"
#include "lockstep/core/error.h"
#include "lockstep/core/read_file.h"
namespace lockstep {
// A named namespace around the helpers: the unity build puts this file in one
// translation unit with others, whose anonymous namespaces would share names.
namespace dcp_read {
namespace {

using Kind = PickleValue::Kind;
using dcp_format::Chunk;
using dcp_format::TensorEntry;
using dcp_format::check_chunks;
using dcp_format::dims_text;
using dcp_format::directory_path;
using dcp_format::dtype_names;
using dcp_format::volume;
namespace fs = std::filesystem;

// ---- reading .metadata -----------------------------------------------------

struct StorageInfo {
  std::string file;
  int64_t offset = 0;
  int64_t length = 0;
};
// A chunk's bytes are found by its tensor's name and the chunk's offsets (DCP's MetadataIndex).
using ChunkKey = std::pair<std::string, std::vector<int64_t>>;

struct Metadata {
  std::map<std::string, TensorEntry> tensors;
  std::set<std::string> objects;  // BytesStorageMetadata: torch.save'd Python objects
  std::map<ChunkKey, StorageInfo> storage;
};

// Walks the unpickled Metadata; every error names the .metadata file.
class MetadataReader {
 public:
  explicit MetadataReader(std::string source) : source_(std::move(source)) {}

  Metadata read(const PickleValue& root) {
    expect_object(root, "Metadata", "the pickle");
    Metadata metadata;
    const PickleValue& entries = field(root, "state_dict_metadata", Kind::kDict);
    for (const auto& [key, value] : entries.entries) {
      const std::string& name = text(*key, "a state_dict_metadata key");
      if (is_object(*value, "BytesStorageMetadata")) {
        metadata.objects.insert(name);
        continue;
      }
      expect_object(*value, "TensorStorageMetadata", "entry '" + name + "'");
      metadata.tensors[name] = tensor_entry(*value, name);
    }
    const PickleValue& storage = field(root, "storage_data", Kind::kDict);
    for (const auto& [key, value] : storage.entries) {
      expect_object(*key, "MetadataIndex", "a storage_data key");
      const std::string& name = text(field(*key, "fqn", Kind::kString), "MetadataIndex.fqn");
      const PickleValue* offset = find_field(*key, "offset");
      ChunkKey chunk{name, offset == nullptr || offset->kind == Kind::kNone ? std::vector<int64_t>{}
                                                                              : size_of(*offset, "MetadataIndex.offset")};
      metadata.storage[chunk] = storage_info(*value, name);
    }
    return metadata;
  }

 private:
  template <typename... Args>
  [[noreturn]] void fail(Args&&... args) const {
    LOCKSTEP_FAIL(source_, ": not the metadata of a torch.distributed.checkpoint: ", std::forward<Args>(args)...);
  }

  static bool is_object(const PickleValue& value, const std::string& class_name) {
    const std::string suffix = "." + class_name;
    return value.kind == Kind::kObject && value.text.size() > suffix.size() &&
           value.text.compare(value.text.size() - suffix.size(), suffix.size(), suffix) == 0;
  }
  void expect_object(const PickleValue& value, const std::string& class_name, const std::string& what) const {
    if (!is_object(value, class_name)) fail(what, " is ", value.describe(), ", not a ", class_name);
  }
  // A dataclass's attribute, from the dict BUILD gave it; null when absent.
  static const PickleValue* find_field(const PickleValue& object, const std::string& name) {
    if (object.state == nullptr || object.state->kind != Kind::kDict) return nullptr;
    for (const auto& [key, value] : object.state->entries) {
      if (key->kind == Kind::kString && key->text == name) return value;
    }
    return nullptr;
  }
  const PickleValue& field(const PickleValue& object, const std::string& name, Kind kind) const {
    const PickleValue* value = find_field(object, name);
    if (value == nullptr) fail(object.describe(), " has no attribute '", name, "'");
    if (value->kind != kind) fail(object.text, ".", name, " is ", value->describe());
    return *value;
  }
  const std::string& text(const PickleValue& value, const std::string& what) const {
    if (value.kind != Kind::kString) fail(what, " is ", value.describe(), ", not a string");
    return value.text;
  }
  int64_t integer(const PickleValue& value, const std::string& what) const {
    if (value.kind != Kind::kInt) fail(what, " is ", value.describe(), ", not an int");
    return value.integer;
  }
  // torch.Size((3, 4)) (an object whose argument is the tuple), or a plain tuple.
  std::vector<int64_t> size_of(const PickleValue& value, const std::string& what) const {
    const PickleValue* dims = &value;
    if (is_object(value, "Size") && value.args != nullptr && value.args->items.size() == 1) {
      dims = value.args->items[0];
    }
    if (dims->kind != Kind::kTuple && dims->kind != Kind::kList) fail(what, " is ", value.describe(), ", not a size");
    std::vector<int64_t> out;
    for (const PickleValue* dim : dims->items) out.push_back(integer(*dim, what));
    return out;
  }

  // TensorProperties: its __getstate__ tuple (dtype, layout, requires_grad,
  // memory format, pin_memory) since PyTorch 2.1, its attribute dict before.
  c10::ScalarType dtype_of(const PickleValue& properties, const std::string& name) const {
    expect_object(properties, "TensorProperties", "the properties of '" + name + "'");
    const PickleValue* dtype = nullptr;
    if (properties.state != nullptr && properties.state->kind == Kind::kTuple && !properties.state->items.empty()) {
      dtype = properties.state->items[0];
    } else {
      dtype = find_field(properties, "dtype");
    }
    if (dtype == nullptr || dtype->kind != Kind::kGlobal) {
      fail("the dtype of '", name, "' is ", dtype == nullptr ? std::string("missing") : dtype->describe());
    }
    for (const auto& [type, type_name] : dtype_names()) {
      if (dtype->text == "torch." + type_name) return type;
    }
    LOCKSTEP_FAIL(source_, ": tensor '", name, "' has dtype ", dtype->text, ", which lockstep does not read");
  }

  TensorEntry tensor_entry(const PickleValue& value, const std::string& name) const {
    TensorEntry entry;
    entry.dtype = dtype_of(*find_or_fail(value, "properties"), name);
    entry.size = size_of(*find_or_fail(value, "size"), "the size of '" + name + "'");
    const PickleValue& chunks = field(value, "chunks", Kind::kList);
    for (const PickleValue* chunk : chunks.items) {
      expect_object(*chunk, "ChunkStorageMetadata", "a chunk of '" + name + "'");
      entry.chunks.push_back({size_of(*find_or_fail(*chunk, "offsets"), "a chunk's offsets of '" + name + "'"),
                              size_of(*find_or_fail(*chunk, "sizes"), "a chunk's sizes of '" + name + "'")});
    }
    return entry;
  }
  const PickleValue* find_or_fail(const PickleValue& object, const std::string& name) const {
    const PickleValue* value = find_field(object, name);
    if (value == nullptr) fail(object.describe(), " has no attribute '", name, "'");
    return value;
  }

  StorageInfo storage_info(const PickleValue& value, const std::string& name) const {
    expect_object(value, "_StorageInfo", "the storage of '" + name + "'");
    const PickleValue* transforms = find_field(value, "transform_descriptors");
    if (transforms != nullptr && transforms->kind != Kind::kNone && !transforms->items.empty()) {
      LOCKSTEP_FAIL(source_, ": the chunks of '", name, "' were written through storage transforms (",
                    "_extensions, such as compression), which lockstep does not read");
    }
    return {text(field(value, "relative_path", Kind::kString), "relative_path"),
            integer(field(value, "offset", Kind::kInt), "offset"), integer(field(value, "length", Kind::kInt), "length")};
  }

  std::string source_;
};

// ---- reading the chunks ----------------------------------------------------

// A file's name in storage_data may not leave the checkpoint's directory.
void check_relative_path(const std::string& file, const std::string& source) {
  bool safe = !file.empty() && file[0] != '/';
  for (const auto& part : fs::path(file)) safe = safe && part != "..";
  LOCKSTEP_CHECK(safe, source, ": a chunk's file '", file, "' is not a name inside the checkpoint's directory");
}

// The bytes [offset, offset + length) of `path`, checked against its size.
std::string read_slice(const std::string& path, const StorageInfo& info, const std::string& name) {
  std::ifstream in(path, std::ios::binary);
  LOCKSTEP_CHECK(in.good(), path, ": cannot open it (a chunk of '", name, "' lies there): ", std::strerror(errno));
  in.seekg(0, std::ios::end);
  const int64_t file_size = static_cast<int64_t>(in.tellg());
  LOCKSTEP_CHECK(info.offset >= 0 && info.length >= 0 && info.offset <= file_size &&
                     info.length <= file_size - info.offset,
                 path, ": a chunk of '", name, "' at bytes [", info.offset, ", +", info.length,
                 ") lies past the file's end (", file_size, " bytes): the checkpoint is truncated or not this one's");
  std::string bytes(static_cast<size_t>(info.length), '\0');
  in.seekg(info.offset);
  in.read(bytes.data(), info.length);
  LOCKSTEP_CHECK(in.good(), path, ": reading a chunk of '", name, "' failed");
  return bytes;
}

// The storage of the entry `name` at `offsets` ({} for an object): its file's path and bytes.
std::pair<std::string, std::string> read_record(const std::string& dir, const Metadata& metadata,
                                                const std::string& name, const std::vector<int64_t>& offsets,
                                                const std::string& source) {
  auto found = metadata.storage.find({name, offsets});
  LOCKSTEP_CHECK(found != metadata.storage.end(), source, ": the chunk of '", name, "' at offsets ",
                 dims_text(offsets), " has no storage_data entry (no file holds it)");
  const StorageInfo& info = found->second;
  check_relative_path(info.file, source);
  const std::string path = (fs::path(dir) / info.file).string();
  const std::string where = str_cat(path, " (the chunk of '", name, "' at offsets ", dims_text(offsets), ", bytes [",
                                    info.offset, ", +", info.length, "))");
  return {where, read_slice(path, info, name)};
}

// The part of `box` (offsets, sizes) that `chunk` holds, as views of both; false when they do not meet.
bool overlap_views(const Chunk& chunk, const std::vector<int64_t>& offsets, const std::vector<int64_t>& sizes,
                   torch::Tensor& in_chunk, torch::Tensor& in_box) {
  for (size_t d = 0; d < offsets.size(); ++d) {
    const int64_t begin = std::max(chunk.offsets[d], offsets[d]);
    const int64_t end = std::min(chunk.offsets[d] + chunk.sizes[d], offsets[d] + sizes[d]);
    if (end <= begin) return false;
    in_chunk = in_chunk.narrow(static_cast<int64_t>(d), begin - chunk.offsets[d], end - begin);
    in_box = in_box.narrow(static_cast<int64_t>(d), begin - offsets[d], end - begin);
  }
  return true;
}

torch::Tensor read_box(const std::string& dir, const Metadata& metadata, const std::string& name,
                       const TensorEntry& entry, const std::vector<int64_t>& offsets,
                       const std::vector<int64_t>& sizes, const std::string& source) {
  bool inside = offsets.size() == entry.size.size() && sizes.size() == entry.size.size();
  for (size_t d = 0; inside && d < offsets.size(); ++d) {
    inside = offsets[d] >= 0 && sizes[d] >= 0 && offsets[d] + sizes[d] <= entry.size[d];
  }
  LOCKSTEP_CHECK(inside, source, ": '", name, "' has size ", dims_text(entry.size), "; its part at ",
                 dims_text(offsets), " of sizes ", dims_text(sizes), " lies outside it");
  torch::Tensor box = torch::empty(sizes, torch::TensorOptions().dtype(entry.dtype));
  if (box.numel() == 0 && !sizes.empty()) return box;
  for (const Chunk& chunk : entry.chunks) {
    torch::Tensor probe_chunk = torch::empty(chunk.sizes, torch::TensorOptions().dtype(entry.dtype).device(torch::kMeta));
    torch::Tensor probe_box = box;
    if (volume(chunk.sizes) == 0 || !overlap_views(chunk, offsets, sizes, probe_chunk, probe_box)) continue;
    const auto [where, bytes] = read_record(dir, metadata, name, chunk.offsets, source);
    torch::Tensor part = read_pt_tensor_from_bytes(bytes, where);
    LOCKSTEP_CHECK(part.sizes() == c10::IntArrayRef(chunk.sizes) && part.scalar_type() == entry.dtype, where,
                   ": holds a tensor ", part.scalar_type(), " ", part.sizes(), ", the metadata says ", entry.dtype,
                   " ", dims_text(chunk.sizes));
    torch::Tensor in_box = box;
    overlap_views(chunk, offsets, sizes, part, in_box);
    in_box.copy_(part);
  }
  return box;
}

Metadata read_metadata(const std::string& dir, std::string* source_out) {
  const std::string source = (directory_path(dir) / ".metadata").string();
  LOCKSTEP_CHECK(fs::is_directory(dir), dir, ": not a directory; a torch.distributed.checkpoint is one");
  LOCKSTEP_CHECK(fs::exists(source), dir, ": no .metadata in it, so not a torch.distributed.checkpoint (dcp.save "
                 "writes .metadata last: an interrupted save leaves none)");
  const Unpickled pickle = unpickle_plain(read_file(source), source);
  Metadata metadata = MetadataReader(source).read(*pickle.root);
  for (const auto& [name, entry] : metadata.tensors) check_chunks(entry, name, source);
  *source_out = source;
  return metadata;
}

}  // namespace
}  // namespace dcp_read

bool is_dcp_checkpoint(const std::string& path) {
  std::error_code error;
  return std::filesystem::is_regular_file(std::filesystem::path(path) / ".metadata", error);
}

std::map<std::string, torch::Tensor> read_dcp_state_dict(const std::string& dir) {
  DcpReader reader(dir);
  std::map<std::string, torch::Tensor> tensors;
  for (const auto& name : reader.tensor_names()) tensors[name] = reader.read(name);
  return tensors;
}

// ---- DcpReader ----------------------------------------------------------------

struct DcpReader::Index {
  dcp_read::Metadata metadata;
  std::string source;  // the .metadata file
};

DcpReader::DcpReader(std::string dir) : dir_(std::move(dir)), index_(std::make_unique<Index>()) {
  index_->metadata = dcp_read::read_metadata(dir_, &index_->source);
}
DcpReader::~DcpReader() = default;
DcpReader::DcpReader(DcpReader&&) noexcept = default;

std::vector<std::string> DcpReader::tensor_names() const {
  std::vector<std::string> names;
  for (const auto& entry : index_->metadata.tensors) names.push_back(entry.first);
  return names;
}

std::vector<std::string> DcpReader::object_names() const {
  return {index_->metadata.objects.begin(), index_->metadata.objects.end()};
}

bool DcpReader::has_tensor(const std::string& name) const { return index_->metadata.tensors.count(name) > 0; }
bool DcpReader::has_object(const std::string& name) const { return index_->metadata.objects.count(name) > 0; }

const std::vector<int64_t>& DcpReader::size(const std::string& name) const {
  auto found = index_->metadata.tensors.find(name);
  LOCKSTEP_CHECK(found != index_->metadata.tensors.end(), dir_, ": the checkpoint holds no tensor '", name, "'");
  return found->second.size;
}

c10::ScalarType DcpReader::dtype(const std::string& name) const {
  (void)size(name);
  return index_->metadata.tensors.at(name).dtype;
}

torch::Tensor DcpReader::read(const std::string& name) const {
  const std::vector<int64_t>& whole = size(name);
  return read_box(name, std::vector<int64_t>(whole.size(), 0), whole);
}

torch::Tensor DcpReader::read_box(const std::string& name, const std::vector<int64_t>& offsets,
                                  const std::vector<int64_t>& sizes) const {
  (void)size(name);
  return dcp_read::read_box(dir_, index_->metadata, name, index_->metadata.tensors.at(name), offsets, sizes,
                            index_->source);
}

Unpickled DcpReader::read_object(const std::string& name) const {
  LOCKSTEP_CHECK(has_object(name), dir_, ": the checkpoint holds no object '", name, "'");
  const auto [where, bytes] = dcp_read::read_record(dir_, index_->metadata, name, {}, index_->source);
  ZipArchive archive(bytes, where);
  LOCKSTEP_CHECK(archive.has("data.pkl"), where, ": not a torch.save record (no data.pkl)");
  return unpickle_plain(std::string(archive.read("data.pkl")), where);
}

}  // namespace lockstep
