#include "lockstep/checkpoint/dcp_checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <filesystem>
#include <utility>
#include <vector>

#include <c10/macros/Macros.h>

#include "lockstep/checkpoint/pickle_writer.h"
#include "lockstep/checkpoint/internal/dcp_format.h"
#include "lockstep/checkpoint/pt_file.h"
#include "lockstep/core/atomic_file.h"
#include "lockstep/core/error.h"

namespace lockstep {
// A named namespace around the helpers: the unity build puts this file in one
// translation unit with others, whose anonymous namespaces would share names.
namespace dcp_write {
namespace {

using dcp_format::TensorEntry;
using dcp_format::check_chunks;
using dcp_format::dims_text;
using dcp_format::directory_path;
using dcp_format::dtype_names;
using dcp_format::kDcpVersion;
using dcp_format::kFilesystemModule;
using dcp_format::kMetadataModule;
namespace fs = std::filesystem;

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
}  // namespace dcp_write

std::string dcp_name(const DcpPath& path) {
  std::string name;
  for (const auto& part : path) {
    if (!name.empty()) name += ".";
    name += part.is_number_integer() ? std::to_string(part.get<int64_t>()) : part.get<std::string>();
  }
  return name;
}

void write_dcp_state_dict(const std::map<std::string, torch::Tensor>& tensors, const std::string& dir) {
  const std::filesystem::path target = dcp_write::directory_path(dir);
  DcpRankPart part;
  for (const auto& [name, tensor] : tensors) {
    DcpTensorPart whole;
    whole.path = nlohmann::json::array({name});
    whole.size = tensor.sizes().vec();
    whole.offsets.assign(whole.size.size(), 0);
    whole.values = tensor.detach();
    part.tensors.push_back(std::move(whole));
  }
  dcp_write::StagingDirectory staged(target.string() + ".tmp-" + std::to_string(::getpid()));
  const nlohmann::json records = write_dcp_rank_file(staged.path().string(), 0, part);
  write_dcp_metadata(staged.path().string(), {records});
  dcp_write::replace_directory(staged.path(), target);
}

nlohmann::json write_dcp_rank_file(const std::string& dir, int rank, const DcpRankPart& part) {
  return dcp_write::write_rank_file(dir, rank, part);
}

void write_dcp_metadata(const std::string& dir, const std::vector<nlohmann::json>& rank_records) {
  dcp_write::write_metadata(dir, rank_records);
}

std::vector<DcpBox> dcp_boxes_of_range(const std::vector<int64_t>& shape, int64_t begin, int64_t count) {
  std::vector<DcpBox> boxes;
  dcp_write::box_ranges(shape, 0, {}, begin, count, 0, boxes);
  return boxes;
}

}  // namespace lockstep
