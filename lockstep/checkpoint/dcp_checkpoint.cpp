#include "lockstep/checkpoint/dcp_checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <filesystem>
#include <set>
#include <fstream>
#include <utility>
#include <vector>

#include <c10/macros/Macros.h>

#include "lockstep/checkpoint/pickle_writer.h"
#include "lockstep/checkpoint/pt_file.h"
#include "lockstep/checkpoint/torch_pickle.h"
#include "lockstep/checkpoint/zip_archive.h"
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

// ---- writing .metadata -----------------------------------------------------

const std::string& dtype_name(c10::ScalarType type, const std::string& name) {
  for (const auto& [known, type_name] : dtype_names()) {
    if (known == type) return type_name;
  }
  LOCKSTEP_FAIL("DCP checkpoint: tensor '", name, "' has dtype ", type, ", which DCP files of lockstep do not hold");
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

// One written record: a box of a tensor (dtype set) or an object.
struct Record {
  std::string name;
  DcpPath path;
  std::string file;
  int64_t offset = 0;
  int64_t length = 0;
  std::string dtype;  // "" for an object
  std::vector<int64_t> size, offsets, sizes;
};

nlohmann::json record_json(const Record& r) {
  nlohmann::json j{{"name", r.name}, {"path", r.path}, {"file", r.file}, {"offset", r.offset}, {"length", r.length}};
  if (!r.dtype.empty()) {
    j["dtype"] = r.dtype;
    j["size"] = r.size;
    j["offsets"] = r.offsets;
    j["sizes"] = r.sizes;
  }
  return j;
}

Record record_of(const nlohmann::json& j) {
  Record r;
  r.name = j.at("name").get<std::string>();
  r.path = j.at("path");
  r.file = j.at("file").get<std::string>();
  r.offset = j.at("offset").get<int64_t>();
  r.length = j.at("length").get<int64_t>();
  if (j.contains("dtype")) {
    r.dtype = j.at("dtype").get<std::string>();
    r.size = j.at("size").get<std::vector<int64_t>>();
    r.offsets = j.at("offsets").get<std::vector<int64_t>>();
    r.sizes = j.at("sizes").get<std::vector<int64_t>>();
  }
  return r;
}

void write_chunk_list(PickleWriter& out, const std::vector<const Record*>& boxes) {
  out.empty_list();
  out.mark();
  for (const Record* box : boxes) {
    begin_dataclass(out, kMetadataModule, "ChunkStorageMetadata");
    out.string("offsets");
    write_size(out, box->offsets);
    out.string("sizes");
    write_size(out, box->sizes);
    end_dataclass(out);
  }
  out.appends();
}

// The path as DCP's planner keeps it: a tuple of keys (str) and list indices (int).
void write_path(PickleWriter& out, const DcpPath& path) {
  out.mark();
  for (const auto& part : path) {
    if (part.is_number_integer()) {
      out.integer(part.get<int64_t>());
    } else {
      out.string(part.get<std::string>());
    }
  }
  out.tuple();
}

// storage_data: MetadataIndex(fqn, offset, index) -> _StorageInfo(relative_path, offset, length).
void write_storage_entry(PickleWriter& out, const Record& record, int64_t index) {
  begin_dataclass(out, kMetadataModule, "MetadataIndex");
  out.string("fqn");
  out.string(record.name);
  out.string("offset");
  if (record.dtype.empty()) {
    out.none();
  } else {
    write_size(out, record.offsets);
  }
  out.string("index");
  if (record.dtype.empty()) {
    out.none();
  } else {
    out.integer(index);
  }
  end_dataclass(out);
  begin_dataclass(out, kFilesystemModule, "_StorageInfo");
  out.string("relative_path");
  out.string(record.file);
  out.string("offset");
  out.integer(record.offset);
  out.string("length");
  out.integer(record.length);
  end_dataclass(out);
}

// The Metadata pickle, as dcp.save's coordinator writes it; `tensors` maps
// each tensor's name to its boxes (in offset order), `objects` each object's to its record.
std::string metadata_pickle(const std::map<std::string, std::vector<const Record*>>& tensors,
                            const std::map<std::string, const Record*>& objects) {
  PickleWriter out;
  begin_dataclass(out, kMetadataModule, "Metadata");
  out.string("state_dict_metadata");
  out.empty_dict();
  out.mark();
  for (const auto& [name, boxes] : tensors) {
    out.string(name);
    begin_dataclass(out, kMetadataModule, "TensorStorageMetadata");
    out.string("properties");
    write_properties(out, boxes.front()->dtype);
    out.string("size");
    write_size(out, boxes.front()->size);
    out.string("chunks");
    write_chunk_list(out, boxes);
    end_dataclass(out);
  }
  for (const auto& [name, record] : objects) {
    out.string(name);
    begin_dataclass(out, kMetadataModule, "BytesStorageMetadata");
    end_dataclass(out);
  }
  out.set_items();
  out.string("planner_data");  // DefaultSavePlanner's mappings: each name to its path in the nested state dict
  out.empty_dict();
  out.mark();
  for (const auto& [name, boxes] : tensors) {
    out.string(name);
    write_path(out, boxes.front()->path);
  }
  for (const auto& [name, record] : objects) {
    out.string(name);
    write_path(out, record->path);
  }
  out.set_items();
  out.string("storage_data");
  out.empty_dict();
  out.mark();
  for (const auto& [name, boxes] : tensors) {
    for (size_t i = 0; i < boxes.size(); ++i) write_storage_entry(out, *boxes[i], static_cast<int64_t>(i));
  }
  for (const auto& [name, record] : objects) write_storage_entry(out, *record, 0);
  out.set_items();
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

nlohmann::json write_rank_file(const std::string& dir, int rank, const DcpRankPart& part) {
  // Everything is checked before a byte is written.
  for (const DcpTensorPart& box : part.tensors) {
    const std::string name = dcp_name(box.path);
    (void)dtype_name(box.values.scalar_type(), name);
    bool inside = box.offsets.size() == box.size.size() && box.values.dim() == static_cast<int64_t>(box.size.size());
    for (size_t d = 0; inside && d < box.size.size(); ++d) {
      inside = box.offsets[d] >= 0 && box.offsets[d] + box.values.size(static_cast<int64_t>(d)) <= box.size[d];
    }
    LOCKSTEP_CHECK(inside, "DCP checkpoint: a part of '", name, "' of sizes ", box.values.sizes(), " at offsets ",
                   dims_text(box.offsets), " does not fit its size ", dims_text(box.size));
  }
  const std::string file = str_cat("__", rank, "_0.distcp");
  nlohmann::json records = nlohmann::json::array();
  AtomicFileWriter data((fs::path(dir) / file).string());
  auto append = [&](Record record, const std::string& bytes) {
    record.file = file;
    record.offset = static_cast<int64_t>(data.bytes_written());
    record.length = static_cast<int64_t>(bytes.size());
    data.write(bytes);
    records.push_back(record_json(record));
  };
  for (const DcpTensorPart& box : part.tensors) {
    Record record;
    record.name = dcp_name(box.path);
    record.path = box.path;
    record.dtype = dtype_name(box.values.scalar_type(), record.name);
    record.size = box.size;
    record.offsets = box.offsets;
    record.sizes = box.values.sizes().vec();
    append(std::move(record), pt_tensor_bytes(box.values));
  }
  for (const DcpObject& object : part.objects) {
    Record record;
    record.name = dcp_name(object.path);
    record.path = object.path;
    append(std::move(record), pt_object_bytes(object.value));
  }
  data.commit();
  return records;
}

void write_metadata(const std::string& dir, const std::vector<nlohmann::json>& rank_records) {
  std::vector<Record> records;
  for (const auto& list : rank_records) {
    for (const auto& item : list) records.push_back(record_of(item));
  }
  std::map<std::string, std::vector<const Record*>> tensors;
  std::map<std::string, const Record*> objects;
  for (const Record& record : records) {
    if (record.dtype.empty()) {
      LOCKSTEP_CHECK(objects.emplace(record.name, &record).second, dir, ": two ranks wrote the object '", record.name,
                     "'");
    } else {
      tensors[record.name].push_back(&record);
    }
  }
  for (auto& [name, boxes] : tensors) {
    std::sort(boxes.begin(), boxes.end(), [](const Record* a, const Record* b) { return a->offsets < b->offsets; });
    TensorEntry entry;
    entry.size = boxes.front()->size;
    for (const Record* box : boxes) {
      LOCKSTEP_CHECK(box->size == entry.size && box->dtype == boxes.front()->dtype, dir, ": the parts of '", name,
                     "' disagree: one is of a ", boxes.front()->dtype, " tensor of size ", dims_text(entry.size),
                     ", another of a ", box->dtype, " one of size ", dims_text(box->size));
      entry.chunks.push_back({box->offsets, box->sizes});
    }
    LOCKSTEP_CHECK(!objects.count(name), dir, ": '", name, "' is both a tensor and an object");
    check_chunks(entry, name, dir);
  }
  write_file_atomically((directory_path(dir) / ".metadata").string(), metadata_pickle(tensors, objects));
}

void box_ranges(const std::vector<int64_t>& shape, size_t dim, std::vector<int64_t> prefix, int64_t begin,
                int64_t count, int64_t flat_begin, std::vector<DcpBox>& out) {
  if (count <= 0) return;
  if (dim == shape.size()) {  // a 0-dim tensor: its one element
    out.push_back({prefix, std::vector<int64_t>(prefix.size(), 1), flat_begin});
    return;
  }
  int64_t row = 1;
  for (size_t d = dim + 1; d < shape.size(); ++d) row *= shape[d];
  // Lead: the rest of a partial first row, within that row.
  if (begin % row != 0) {
    const int64_t lead = std::min(count, row - begin % row);
    std::vector<int64_t> inner = prefix;
    inner.push_back(begin / row);
    box_ranges(shape, dim + 1, inner, begin % row, lead, flat_begin, out);
    begin += lead;
    count -= lead;
    flat_begin += lead;
  }
  // Whole rows.
  if (count >= row && row > 0) {
    DcpBox box;
    box.offsets = prefix;
    box.offsets.push_back(begin / row);
    box.sizes.assign(prefix.size(), 1);
    box.sizes.push_back(count / row);
    for (size_t d = dim + 1; d < shape.size(); ++d) {
      box.offsets.push_back(0);
      box.sizes.push_back(shape[d]);
    }
    box.flat_begin = flat_begin;
    out.push_back(box);
    const int64_t whole = (count / row) * row;
    begin += whole;
    count -= whole;
    flat_begin += whole;
  }
  // Tail: the start of a last row.
  if (count > 0) {
    std::vector<int64_t> inner = prefix;
    inner.push_back(begin / row);
    box_ranges(shape, dim + 1, inner, 0, count, flat_begin, out);
  }
}

}  // namespace
}  // namespace dcp_file

std::string dcp_name(const DcpPath& path) {
  std::string name;
  for (const auto& part : path) {
    if (!name.empty()) name += ".";
    name += part.is_number_integer() ? std::to_string(part.get<int64_t>()) : part.get<std::string>();
  }
  return name;
}

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

void write_dcp_state_dict(const std::map<std::string, torch::Tensor>& tensors, const std::string& dir) {
  const std::filesystem::path target = dcp_file::directory_path(dir);
  DcpRankPart part;
  for (const auto& [name, tensor] : tensors) {
    DcpTensorPart whole;
    whole.path = nlohmann::json::array({name});
    whole.size = tensor.sizes().vec();
    whole.offsets.assign(whole.size.size(), 0);
    whole.values = tensor.detach();
    part.tensors.push_back(std::move(whole));
  }
  dcp_file::StagingDirectory staged(target.string() + ".tmp-" + std::to_string(::getpid()));
  const nlohmann::json records = write_dcp_rank_file(staged.path().string(), 0, part);
  write_dcp_metadata(staged.path().string(), {records});
  dcp_file::replace_directory(staged.path(), target);
}

nlohmann::json write_dcp_rank_file(const std::string& dir, int rank, const DcpRankPart& part) {
  return dcp_file::write_rank_file(dir, rank, part);
}

void write_dcp_metadata(const std::string& dir, const std::vector<nlohmann::json>& rank_records) {
  dcp_file::write_metadata(dir, rank_records);
}

std::vector<DcpBox> dcp_boxes_of_range(const std::vector<int64_t>& shape, int64_t begin, int64_t count) {
  std::vector<DcpBox> boxes;
  dcp_file::box_ranges(shape, 0, {}, begin, count, 0, boxes);
  return boxes;
}

// ---- DcpReader ----------------------------------------------------------------

struct DcpReader::Index {
  dcp_file::Metadata metadata;
  std::string source;  // the .metadata file
};

DcpReader::DcpReader(std::string dir) : dir_(std::move(dir)), index_(std::make_unique<Index>()) {
  index_->metadata = dcp_file::read_metadata(dir_, &index_->source);
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
  return dcp_file::read_box(dir_, index_->metadata, name, index_->metadata.tensors.at(name), offsets, sizes,
                            index_->source);
}

Unpickled DcpReader::read_object(const std::string& name) const {
  LOCKSTEP_CHECK(has_object(name), dir_, ": the checkpoint holds no object '", name, "'");
  const auto [where, bytes] = dcp_file::read_record(dir_, index_->metadata, name, {}, index_->source);
  ZipArchive archive(bytes, where);
  LOCKSTEP_CHECK(archive.has("data.pkl"), where, ": not a torch.save record (no data.pkl)");
  return unpickle_plain(std::string(archive.read("data.pkl")), where);
}

}  // namespace lockstep
