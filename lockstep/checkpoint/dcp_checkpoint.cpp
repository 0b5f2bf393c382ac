#include "lockstep/checkpoint/dcp_checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <utility>
#include <vector>

#include <c10/macros/Macros.h>

#include "lockstep/checkpoint/pickle_writer.h"
#include "lockstep/checkpoint/pt_file.h"
#include "lockstep/checkpoint/torch_pickle.h"
#include "lockstep/core/atomic_file.h"
#include "lockstep/core/error.h"
#include "lockstep/core/read_file.h"

namespace lockstep {
// A named namespace around the helpers: the unity build puts this file in one
// translation unit with others, whose anonymous namespaces would share names.
namespace dcp_file {
namespace {

using Kind = PickleValue::Kind;
namespace fs = std::filesystem;

constexpr char kMetadataModule[] = "torch.distributed.checkpoint.metadata";
constexpr char kFilesystemModule[] = "torch.distributed.checkpoint.filesystem";
constexpr char kDataFile[] = "__0_0.distcp";
constexpr char kDcpVersion[] = "1.0.0";  // filesystem.py's CURRENT_DCP_VERSION in PyTorch 2.14

// torch.<name> of each dtype DCP's TensorProperties may hold.
const std::vector<std::pair<c10::ScalarType, std::string>>& dtype_names() {
  static const std::vector<std::pair<c10::ScalarType, std::string>> names{
      {c10::kFloat, "float32"},     {c10::kDouble, "float64"},       {c10::kHalf, "float16"},
      {c10::kBFloat16, "bfloat16"}, {c10::kLong, "int64"},           {c10::kInt, "int32"},
      {c10::kShort, "int16"},       {c10::kChar, "int8"},            {c10::kByte, "uint8"},
      {c10::kBool, "bool"},         {c10::kComplexFloat, "complex64"}, {c10::kComplexDouble, "complex128"}};
  return names;
}

// ---- reading .metadata -----------------------------------------------------

struct Chunk {
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;
};
struct TensorEntry {
  c10::ScalarType dtype = c10::kFloat;
  std::vector<int64_t> size;
  std::vector<Chunk> chunks;
};
struct StorageInfo {
  std::string file;
  int64_t offset = 0;
  int64_t length = 0;
};
// A chunk's bytes are found by its tensor's name and the chunk's offsets (DCP's MetadataIndex).
using ChunkKey = std::pair<std::string, std::vector<int64_t>>;

struct Metadata {
  std::map<std::string, TensorEntry> tensors;
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
      if (is_object(*value, "BytesStorageMetadata")) continue;  // a Python object: skipped (header)
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

int64_t volume(const std::vector<int64_t>& sizes) {
  int64_t n = 1;
  for (int64_t size : sizes) n *= size;
  return n;
}

std::string dims_text(const std::vector<int64_t>& dims) { return str_cat(c10::IntArrayRef(dims)); }

// Each chunk lies inside its tensor, no two overlap and together they cover it.
void check_chunks(const TensorEntry& entry, const std::string& name, const std::string& source) {
  const size_t rank = entry.size.size();
  int64_t covered = 0;
  for (size_t i = 0; i < entry.chunks.size(); ++i) {
    const Chunk& chunk = entry.chunks[i];
    bool inside = chunk.offsets.size() == rank && chunk.sizes.size() == rank;
    for (size_t d = 0; inside && d < rank; ++d) {
      inside = chunk.offsets[d] >= 0 && chunk.sizes[d] >= 0 && chunk.sizes[d] <= entry.size[d] &&
               chunk.offsets[d] <= entry.size[d] - chunk.sizes[d];
    }
    LOCKSTEP_CHECK(inside, source, ": a chunk of '", name, "' at offsets ", dims_text(chunk.offsets), " with sizes ",
                   dims_text(chunk.sizes), " lies outside the tensor's size ", dims_text(entry.size));
    covered += volume(chunk.sizes);
    for (size_t j = 0; j < i; ++j) {
      const Chunk& other = entry.chunks[j];
      bool overlap = volume(chunk.sizes) > 0 && volume(other.sizes) > 0;
      for (size_t d = 0; overlap && d < rank; ++d) {
        overlap = chunk.offsets[d] < other.offsets[d] + other.sizes[d] &&
                  other.offsets[d] < chunk.offsets[d] + chunk.sizes[d];
      }
      LOCKSTEP_CHECK(!overlap, source, ": two chunks of '", name, "' overlap (at offsets ", dims_text(other.offsets),
                     " and ", dims_text(chunk.offsets), ")");
    }
  }
  LOCKSTEP_CHECK(covered == volume(entry.size), source, ": the chunks of '", name, "' hold ", covered,
                 " elements of its ", volume(entry.size), " (size ", dims_text(entry.size), ")");
}

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

torch::Tensor read_tensor(const std::string& dir, const Metadata& metadata, const std::string& name,
                          const TensorEntry& entry, const std::string& source) {
  check_chunks(entry, name, source);
  torch::Tensor whole = torch::empty(entry.size, torch::TensorOptions().dtype(entry.dtype));
  for (const Chunk& chunk : entry.chunks) {
    auto found = metadata.storage.find({name, chunk.offsets});
    LOCKSTEP_CHECK(found != metadata.storage.end(), source, ": the chunk of '", name, "' at offsets ",
                   dims_text(chunk.offsets), " has no storage_data entry (no file holds it)");
    const StorageInfo& info = found->second;
    check_relative_path(info.file, source);
    const std::string path = (fs::path(dir) / info.file).string();
    const std::string where = str_cat(path, " (the chunk of '", name, "' at offsets ", dims_text(chunk.offsets),
                                      ", bytes [", info.offset, ", +", info.length, "))");
    torch::Tensor part = read_pt_tensor_from_bytes(read_slice(path, info, name), where);
    LOCKSTEP_CHECK(part.sizes() == c10::IntArrayRef(chunk.sizes) && part.scalar_type() == entry.dtype, where,
                   ": holds a tensor ", part.scalar_type(), " ", part.sizes(), ", the metadata says ", entry.dtype,
                   " ", dims_text(chunk.sizes));
    torch::Tensor target = whole;
    for (size_t d = 0; d < chunk.offsets.size(); ++d) {
      target = target.narrow(static_cast<int64_t>(d), chunk.offsets[d], chunk.sizes[d]);
    }
    target.copy_(part);
  }
  return whole;
}

// ---- writing .metadata -----------------------------------------------------

const std::string& dtype_name(c10::ScalarType type, const std::string& name) {
  for (const auto& [known, type_name] : dtype_names()) {
    if (known == type) return type_name;
  }
  LOCKSTEP_FAIL("write_dcp_state_dict: tensor '", name, "' has dtype ", type, ", which DCP files of lockstep do not hold");
}

void write_size(PickleWriter& out, const std::vector<int64_t>& dims) {  // torch.Size((...))
  out.global("torch", "Size");
  out.mark();
  for (int64_t dim : dims) out.integer(dim);
  out.tuple();
  out.tuple_of(1);
  out.reduce();
}

// A dataclass instance: Class.__new__(Class), then BUILD with its attributes,
// whose key/value pairs the caller writes between the two.
void begin_dataclass(PickleWriter& out, const std::string& module, const std::string& name) {
  out.global(module, name);
  out.tuple_of(0);
  out.new_object();
  out.empty_dict();
  out.mark();
}
void end_dataclass(PickleWriter& out) {
  out.set_items();
  out.build();
}

// TensorProperties, as its __getstate__ gives it: (dtype, layout,
// requires_grad, _MEM_FORMAT_ENCODING, pin_memory).
void write_properties(PickleWriter& out, const std::string& dtype) {
  out.global(kMetadataModule, "TensorProperties");
  out.tuple_of(0);
  out.new_object();
  out.mark();
  out.global("torch", dtype);
  out.global("torch.serialization", "_get_layout");
  out.string("torch.strided");
  out.tuple_of(1);
  out.reduce();
  out.boolean(false);
  out.global(kMetadataModule, "_MEM_FORMAT_ENCODING");
  out.integer(0);  // TORCH_CONTIGUOUS_FORMAT
  out.tuple_of(1);
  out.reduce();
  out.boolean(false);
  out.tuple();
  out.build();
}

// One whole-tensor chunk per tensor, at offsets 0.
void write_tensor_metadata(PickleWriter& out, const torch::Tensor& tensor, const std::string& name) {
  const std::vector<int64_t> size = tensor.sizes().vec();
  begin_dataclass(out, kMetadataModule, "TensorStorageMetadata");
  out.string("properties");
  write_properties(out, dtype_name(tensor.scalar_type(), name));
  out.string("size");
  write_size(out, size);
  out.string("chunks");
  out.empty_list();
  out.mark();
  begin_dataclass(out, kMetadataModule, "ChunkStorageMetadata");
  out.string("offsets");
  write_size(out, std::vector<int64_t>(size.size(), 0));
  out.string("sizes");
  write_size(out, size);
  end_dataclass(out);
  out.appends();
  end_dataclass(out);
}

struct Written {
  std::string name;
  torch::Tensor tensor;
  int64_t offset = 0;
  int64_t length = 0;
};

// storage_data: MetadataIndex(fqn, offset) -> _StorageInfo(relative_path, offset, length).
void write_storage_data(PickleWriter& out, const std::vector<Written>& written) {
  out.empty_dict();
  out.mark();
  for (const Written& item : written) {
    begin_dataclass(out, kMetadataModule, "MetadataIndex");
    out.string("fqn");
    out.string(item.name);
    out.string("offset");
    write_size(out, std::vector<int64_t>(static_cast<size_t>(item.tensor.dim()), 0));
    out.string("index");
    out.integer(0);
    end_dataclass(out);
    begin_dataclass(out, kFilesystemModule, "_StorageInfo");
    out.string("relative_path");
    out.string(kDataFile);
    out.string("offset");
    out.integer(item.offset);
    out.string("length");
    out.integer(item.length);
    end_dataclass(out);
  }
  out.set_items();
}

// The Metadata pickle, as dcp.save's coordinator writes it.
std::string metadata_pickle(const std::vector<Written>& written) {
  PickleWriter out;
  begin_dataclass(out, kMetadataModule, "Metadata");
  out.string("state_dict_metadata");
  out.empty_dict();
  out.mark();
  for (const Written& item : written) {
    out.string(item.name);
    write_tensor_metadata(out, item.tensor, item.name);
  }
  out.set_items();
  out.string("planner_data");  // DefaultSavePlanner's mappings: each name, unflattened, is itself
  out.empty_dict();
  out.mark();
  for (const Written& item : written) {
    out.string(item.name);
    out.string(item.name);
    out.tuple_of(1);
  }
  out.set_items();
  out.string("storage_data");
  write_storage_data(out, written);
  out.string("storage_meta");
  out.none();
  out.string("version");
  out.string(kDcpVersion);
  end_dataclass(out);
  return out.finish();
}

// ---- the directory ---------------------------------------------------------

// Puts the complete directory `staged` at `dir`: an atomic exchange where
// one is there already (renameat2), then the old one, now at `staged`, goes.
void replace_directory(const fs::path& staged, const fs::path& dir) {
  std::error_code error;
  const bool exists = fs::exists(dir, error);
  LOCKSTEP_CHECK(!exists || fs::is_directory(dir, error), dir.string(),
                 ": exists and is not a directory; a DCP checkpoint is a directory");
  if (!exists) {
    LOCKSTEP_CHECK(::rename(staged.c_str(), dir.c_str()) == 0, dir.string(), ": cannot rename ", staged.string(),
                   " to it: ", std::strerror(errno));
  } else if (::renameat2(AT_FDCWD, staged.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) != 0) {
    // A file system without the exchange: move the old one aside first. A
    // writer killed between the two renames leaves it whole at `aside`.
    const fs::path aside = dir.string() + ".old-" + std::to_string(::getpid());
    fs::remove_all(aside, error);
    LOCKSTEP_CHECK(::rename(dir.c_str(), aside.c_str()) == 0 && ::rename(staged.c_str(), dir.c_str()) == 0,
                   dir.string(), ": cannot put the new checkpoint in its place: ", std::strerror(errno));
    fs::rename(aside, staged, error);
  }
  sync_directory(dir.parent_path().string());
  fs::remove_all(staged, error);
}

// Removes the staging directory unless it was put in place.
class StagingDirectory {
 public:
  explicit StagingDirectory(fs::path path) : path_(std::move(path)) {
    std::error_code error;
    fs::remove_all(path_, error);  // left by a killed writer of the same process id
    LOCKSTEP_CHECK(fs::create_directories(path_, error), path_.string(), ": cannot create it: ", error.message());
  }
  ~StagingDirectory() {
    std::error_code error;
    fs::remove_all(path_, error);
  }
  C10_DISABLE_COPY_AND_ASSIGN(StagingDirectory);
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// `dir` without trailing slashes, so that its parent is where it lies.
fs::path directory_path(const std::string& dir) {
  std::string trimmed = dir;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  return fs::path(trimmed);
}

std::map<std::string, torch::Tensor> read_state_dict(const std::string& dir) {
  const std::string source = (directory_path(dir) / ".metadata").string();
  LOCKSTEP_CHECK(fs::is_directory(dir), dir, ": not a directory; a torch.distributed.checkpoint is one");
  LOCKSTEP_CHECK(fs::exists(source), dir, ": no .metadata in it, so not a torch.distributed.checkpoint (dcp.save "
                 "writes .metadata last: an interrupted save leaves none)");
  const Unpickled pickle = unpickle_plain(read_file(source), source);
  const Metadata metadata = MetadataReader(source).read(*pickle.root);
  std::map<std::string, torch::Tensor> tensors;
  for (const auto& [name, entry] : metadata.tensors) {
    tensors[name] = read_tensor(dir, metadata, name, entry, source);
  }
  return tensors;
}

void write_state_dict(const std::map<std::string, torch::Tensor>& tensors, const std::string& dir) {
  const fs::path target = directory_path(dir);
  std::vector<Written> written;
  for (const auto& [name, tensor] : tensors) {
    (void)dtype_name(tensor.scalar_type(), name);  // before anything is written
    Written item;
    item.name = name;
    item.tensor = tensor.detach().to(torch::kCPU).contiguous();
    written.push_back(std::move(item));
  }
  StagingDirectory staged(target.string() + ".tmp-" + std::to_string(::getpid()));
  {
    AtomicFileWriter data((staged.path() / kDataFile).string());
    for (Written& item : written) {
      const std::string bytes = pt_tensor_bytes(item.tensor);
      item.offset = static_cast<int64_t>(data.bytes_written());
      item.length = static_cast<int64_t>(bytes.size());
      data.write(bytes);
    }
    data.commit();
  }
  write_file_atomically((staged.path() / ".metadata").string(), metadata_pickle(written));
  replace_directory(staged.path(), target);
}

}  // namespace
}  // namespace dcp_file

bool is_dcp_checkpoint(const std::string& path) {
  std::error_code error;
  return std::filesystem::is_regular_file(std::filesystem::path(path) / ".metadata", error);
}

std::map<std::string, torch::Tensor> read_dcp_state_dict(const std::string& dir) {
  return dcp_file::read_state_dict(dir);
}

void write_dcp_state_dict(const std::map<std::string, torch::Tensor>& tensors, const std::string& dir) {
  dcp_file::write_state_dict(tensors, dir);
}

}  // namespace lockstep
