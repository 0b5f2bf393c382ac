#include "lockstep/checkpoint/checkpoint_file.h"

#include <filesystem>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <limits>
#include <optional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "lockstep/core/atomic_file.h"
#include "lockstep/core/error.h"
#include "lockstep/core/fault_point.h"

namespace lockstep {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "checkpoint files are little-endian");

const char* const kFormat = "lockstep";
const char* const kValuesKey = "lockstep.values";
const char* const kValuesCrcKey = "lockstep.values_crc32";
const char* const kTensorCrcKey = "lockstep.tensor_crc32";
const char* const kIndexCrcKey = "lockstep.index_crc32";
// Tensors larger than one block also carry a checksum per block, so a read of
// some of their elements verifies the blocks it touches and no more. The
// block list has a checksum of its own (not folded into the index's, so
// lockstep versions from before block checksums still read these files).
const char* const kBlockCrcKey = "lockstep.block_crc32";
const char* const kBlockBytesKey = "lockstep.crc_block_bytes";
const char* const kBlockListCrcKey = "lockstep.block_list_crc32";
constexpr uint64_t kCrcBlockBytes = 64 << 10;

struct DtypeName {
  c10::ScalarType type;
  const char* name;
};
const DtypeName kDtypes[] = {
    {torch::kBool, "BOOL"},    {torch::kUInt8, "U8"},   {torch::kInt8, "I8"},    {torch::kInt16, "I16"},
    {torch::kInt32, "I32"},    {torch::kInt64, "I64"},  {torch::kFloat16, "F16"}, {torch::kBFloat16, "BF16"},
    {torch::kFloat32, "F32"},  {torch::kFloat64, "F64"},
};

std::string dtype_name(c10::ScalarType type, const std::string& tensor) {
  for (const auto& entry : kDtypes) {
    if (entry.type == type) return entry.name;
  }
  LOCKSTEP_FAIL("tensor '", tensor, "' has dtype ", c10::toString(type), ", which checkpoint files cannot hold");
}

std::optional<c10::ScalarType> parse_dtype(const std::string& name) {
  for (const auto& entry : kDtypes) {
    if (name == entry.name) return entry.type;
  }
  return std::nullopt;
}

uint32_t crc32_of(const void* data, size_t size, uint32_t crc = 0) {
  const auto* bytes = static_cast<const Bytef*>(data);
  uLong value = crc == 0 ? ::crc32(0L, Z_NULL, 0) : crc;
  while (size > 0) {
    uInt chunk = static_cast<uInt>(std::min<size_t>(size, 1u << 30));
    value = ::crc32(value, bytes, chunk);
    bytes += chunk;
    size -= chunk;
  }
  return static_cast<uint32_t>(value);
}

std::string hex32(uint32_t value) {
  char buffer[9];
  std::snprintf(buffer, sizeof(buffer), "%08x", value);
  return buffer;
}

// The checksum of `size` bytes, and the checksums of their blocks (hex, one
// after the other) when there is more than one block.
struct TensorChecksums {
  uint32_t whole = 0;
  std::string blocks;
};

TensorChecksums checksums_of_bytes(const void* data, uint64_t size) {
  TensorChecksums sums;
  if (size <= kCrcBlockBytes) {
    sums.whole = crc32_of(data, size);
    return sums;
  }
  const auto* bytes = static_cast<const char*>(data);
  uLong whole = ::crc32(0L, Z_NULL, 0);
  for (uint64_t at = 0; at < size; at += kCrcBlockBytes) {
    const uint64_t length = std::min(kCrcBlockBytes, size - at);
    const uint32_t block = crc32_of(bytes + at, length);
    sums.blocks += hex32(block);
    whole = ::crc32_combine(whole, block, static_cast<z_off_t>(length));
  }
  sums.whole = static_cast<uint32_t>(whole);
  return sums;
}

struct Entry {
  std::string name;
  c10::ScalarType dtype = torch::kFloat32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

// A canonical text of the tensor index, so a changed shape or offset that
// still parses is caught by its checksum.
std::string index_text(const std::vector<Entry>& entries) {
  std::ostringstream text;
  for (const auto& entry : entries) {
    text << entry.name << '|' << dtype_name(entry.dtype, entry.name) << '|';
    for (int64_t d : entry.shape) text << d << ',';
    text << '|' << entry.begin << '|' << entry.end << '\n';
  }
  return text.str();
}

std::string block_list_text(const std::string& block_bytes, const std::string& blocks) {
  return block_bytes + "|" + blocks;
}

void write_tensors(const std::string& path, const std::map<std::string, torch::Tensor>& tensors,
                   std::map<std::string, std::string> metadata, bool with_checksums) {
  std::vector<Entry> entries;
  std::vector<torch::Tensor> data;
  nlohmann::json header = nlohmann::json::object();
  nlohmann::json tensor_crcs = nlohmann::json::object();
  nlohmann::json block_crcs = nlohmann::json::object();
  uint64_t offset = 0;
  for (const auto& item : tensors) {
    LOCKSTEP_CHECK(item.first != "__metadata__", "a tensor cannot be named __metadata__");
    LOCKSTEP_CHECK(item.second.defined(), "cannot save tensor '", item.first, "': it is undefined");
    torch::Tensor cpu = item.second.detach().to(torch::kCPU).contiguous();
    Entry entry;
    entry.name = item.first;
    entry.dtype = cpu.scalar_type();
    entry.shape = cpu.sizes().vec();
    entry.begin = offset;
    entry.end = offset + static_cast<uint64_t>(cpu.numel()) * cpu.element_size();
    offset = entry.end;
    header[entry.name] = {{"dtype", dtype_name(entry.dtype, entry.name)},
                          {"shape", entry.shape},
                          {"data_offsets", {entry.begin, entry.end}}};
    if (with_checksums) {
      TensorChecksums sums = checksums_of_bytes(cpu.data_ptr(), entry.end - entry.begin);
      tensor_crcs[entry.name] = hex32(sums.whole);
      if (!sums.blocks.empty()) block_crcs[entry.name] = std::move(sums.blocks);
    }
    entries.push_back(std::move(entry));
    data.push_back(std::move(cpu));
  }
  if (with_checksums) {
    metadata[kTensorCrcKey] = tensor_crcs.dump();
    metadata[kBlockCrcKey] = block_crcs.dump();
    metadata[kBlockBytesKey] = std::to_string(kCrcBlockBytes);
    const std::string blocks = block_list_text(metadata[kBlockBytesKey], metadata[kBlockCrcKey]);
    metadata[kBlockListCrcKey] = hex32(crc32_of(blocks.data(), blocks.size()));
    const std::string index = index_text(entries);
    metadata[kIndexCrcKey] = hex32(crc32_of(index.data(), index.size()));
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string header_text = header.dump();
  // safetensors pads the header with spaces so the data starts 8-byte aligned.
  while ((header_text.size() % 8) != 0) header_text.push_back(' ');
  uint64_t header_size = header_text.size();

  AtomicFileWriter out(path);
  out.write(&header_size, sizeof(header_size));
  out.write(header_text);
  for (const auto& tensor : data) out.write(tensor.data_ptr(), static_cast<size_t>(tensor.numel()) * tensor.element_size());
  out.commit();
}

class FileReader {
 public:
  explicit FileReader(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    LOCKSTEP_CHECK(fd_ >= 0 || errno != ENOENT, path, ": no such file");
    LOCKSTEP_CHECK(fd_ >= 0, "cannot open ", path, ": ", std::strerror(errno));
    struct stat info {};
    const bool stat_ok = ::fstat(fd_, &info) == 0;
    const int stat_errno = errno;
    if (!stat_ok || !S_ISREG(info.st_mode)) {
      ::close(fd_);  // the destructor does not run for a constructor that throws
      LOCKSTEP_CHECK(stat_ok, "cannot stat ", path, ": ", std::strerror(stat_errno));
      LOCKSTEP_FAIL(path, ": not a file (a directory or a device)");
    }
    size_ = static_cast<uint64_t>(info.st_size);
  }
  ~FileReader() {
    if (fd_ >= 0) ::close(fd_);
  }
  uint64_t size() const { return size_; }
  void read_at(uint64_t offset, void* out, uint64_t length) const {
    auto* bytes = static_cast<char*>(out);
    while (length > 0) {
      ssize_t n = ::pread(fd_, bytes, std::min<uint64_t>(length, 1ull << 30), static_cast<off_t>(offset));
      if (n < 0 && errno == EINTR) continue;
      LOCKSTEP_CHECK(n > 0, path_, ": truncated or unreadable at byte ", offset, n < 0 ? std::string(": ") + std::strerror(errno) : "");
      bytes += n;
      offset += static_cast<uint64_t>(n);
      length -= static_cast<uint64_t>(n);
    }
  }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

struct ParsedFile {
  std::vector<Entry> entries;
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;
};

// The one reader of a safetensors header, for checkpoints, plain weight
// files and `lockstep ckpt`: 8 bytes of little-endian length, then that many
// bytes of JSON object. What the entries mean is parse_header's.
struct HeaderJson {
  nlohmann::json json;
  uint64_t data_start = 0;
};

HeaderJson read_header_json(const FileReader& file, const std::string& path) {
  LOCKSTEP_CHECK(file.size() >= 8, path, ": not a safetensors file (", file.size(),
                 " bytes; the header length alone takes 8)");
  uint64_t header_size = 0;
  file.read_at(0, &header_size, 8);
  LOCKSTEP_CHECK(header_size <= kMaxSafetensorsHeaderBytes && header_size <= file.size() - 8, path,
                 ": not a safetensors file, or a truncated one (the header claims ", header_size,
                 " bytes, the file holds ", file.size(), ")");
  std::string text(header_size, '\0');
  file.read_at(8, text.data(), header_size);
  HeaderJson header;
  try {
    header.json = nlohmann::json::parse(text);
  } catch (const std::exception& error) {
    LOCKSTEP_FAIL(path, ": corrupt safetensors header (not valid JSON: ", error.what(), ")");
  }
  LOCKSTEP_CHECK(header.json.is_object(), path, ": corrupt safetensors header (not a JSON object)");
  header.data_start = 8 + header_size;
  return header;
}

ParsedFile parse_header(const FileReader& file, const std::string& path) {
  const HeaderJson raw = read_header_json(file, path);
  const nlohmann::json& header = raw.json;
  ParsedFile parsed;
  parsed.data_start = raw.data_start;
  const uint64_t data_size = file.size() - parsed.data_start;
  for (const auto& item : header.items()) {
    if (item.key() == "__metadata__") {
      LOCKSTEP_CHECK(item.value().is_object(), path, ": corrupt header (__metadata__ is not an object)");
      for (const auto& meta : item.value().items()) {
        LOCKSTEP_CHECK(meta.value().is_string(), path, ": corrupt header (metadata '", meta.key(), "' is not a string)");
        parsed.metadata[meta.key()] = meta.value().get<std::string>();
      }
      continue;
    }
    const auto& value = item.value();
    const std::string& name = item.key();
    LOCKSTEP_CHECK(value.is_object() && value.contains("dtype") && value.contains("shape") &&
                       value.contains("data_offsets") && value["dtype"].is_string() && value["shape"].is_array() &&
                       value["data_offsets"].is_array() && value["data_offsets"].size() == 2,
                   path, ": corrupt header entry for tensor '", name, "'");
    Entry entry;
    entry.name = name;
    auto dtype = parse_dtype(value["dtype"].get<std::string>());
    LOCKSTEP_CHECK(dtype.has_value(), path, ": tensor '", name, "' has unknown dtype '",
                   value["dtype"].get<std::string>(), "'");
    entry.dtype = *dtype;
    uint64_t numel = 1;
    for (const auto& dim : value["shape"]) {
      LOCKSTEP_CHECK(dim.is_number_unsigned() || (dim.is_number_integer() && dim.get<int64_t>() >= 0), path,
                     ": tensor '", name, "' has an invalid shape");
      uint64_t d = dim.get<uint64_t>();
      LOCKSTEP_CHECK(d == 0 || numel <= std::numeric_limits<uint64_t>::max() / d / 8, path, ": tensor '", name,
                     "' has an impossible shape");
      numel *= d;
      entry.shape.push_back(static_cast<int64_t>(d));
    }
    for (const auto& bound : value["data_offsets"]) {
      LOCKSTEP_CHECK(bound.is_number_unsigned() || (bound.is_number_integer() && bound.get<int64_t>() >= 0), path,
                     ": tensor '", name, "' has invalid data offsets");
    }
    entry.begin = value["data_offsets"][0].get<uint64_t>();
    entry.end = value["data_offsets"][1].get<uint64_t>();
    LOCKSTEP_CHECK(entry.begin <= entry.end && entry.end <= data_size, path, ": corrupt or truncated: tensor '", name,
                   "' spans bytes [", entry.begin, ", ", entry.end, ") but the data section holds ", data_size);
    LOCKSTEP_CHECK(entry.end - entry.begin == numel * c10::elementSize(entry.dtype), path, ": tensor '", name,
                   "': shape and dtype need ", numel * c10::elementSize(entry.dtype), " bytes but its offsets give ",
                   entry.end - entry.begin);
    parsed.entries.push_back(std::move(entry));
  }
  std::vector<const Entry*> by_offset;
  for (const auto& entry : parsed.entries) by_offset.push_back(&entry);
  // Empty tensors start where another one does: order them first.
  std::sort(by_offset.begin(), by_offset.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t expected = 0;
  for (const Entry* entry : by_offset) {
    LOCKSTEP_CHECK(entry->begin == expected, path, ": corrupt header: tensor '", entry->name,
                   "' does not start where the previous one ends (overlap or gap at byte ", expected, ")");
    expected = entry->end;
  }
  LOCKSTEP_CHECK(expected == data_size, path, ": ", expected < data_size ? "unexpected trailing bytes" : "truncated",
                 ": the tensors cover ", expected, " bytes, the data section holds ", data_size);
  return parsed;
}

torch::Tensor read_tensor(const FileReader& file, const ParsedFile& parsed, const Entry& entry) {
  torch::Tensor tensor = torch::empty(entry.shape, torch::TensorOptions().dtype(entry.dtype));
  if (entry.end > entry.begin) file.read_at(parsed.data_start + entry.begin, tensor.data_ptr(), entry.end - entry.begin);
  return tensor;
}

struct Checksums {
  nlohmann::json tensors;
  nlohmann::json blocks = nlohmann::json::object();  // none in files written before block checksums
  uint64_t block_bytes = 0;
  std::string index;
  std::string values;
};

Checksums checksums_of(const ParsedFile& parsed, const std::string& path) {
  auto get = [&](const char* key) -> const std::string& {
    auto found = parsed.metadata.find(key);
    LOCKSTEP_CHECK(found != parsed.metadata.end(), path, ": not a lockstep checkpoint (no '", key,
                   "' in its metadata; a plain safetensors file is read with read_safetensors_file)");
    return found->second;
  };
  auto format = parsed.metadata.find("format");
  LOCKSTEP_CHECK(format != parsed.metadata.end() && format->second == kFormat, path,
                 ": not a lockstep checkpoint (its metadata 'format' is ",
                 format == parsed.metadata.end() ? std::string("missing") : "'" + format->second + "'", ")");
  Checksums sums;
  try {
    sums.tensors = nlohmann::json::parse(get(kTensorCrcKey));
  } catch (const nlohmann::json::exception&) {
    LOCKSTEP_FAIL(path, ": corrupt header (tensor checksums unreadable)");
  }
  const size_t block_keys = parsed.metadata.count(kBlockCrcKey) + parsed.metadata.count(kBlockBytesKey) +
                            parsed.metadata.count(kBlockListCrcKey);
  LOCKSTEP_CHECK(block_keys == 0 || block_keys == 3, path, ": corrupt header (block checksums incomplete)");
  if (block_keys == 3) {
    const std::string blocks =
        block_list_text(parsed.metadata.at(kBlockBytesKey), parsed.metadata.at(kBlockCrcKey));
    LOCKSTEP_CHECK(hex32(crc32_of(blocks.data(), blocks.size())) == parsed.metadata.at(kBlockListCrcKey), path,
                   ": corrupt header: the block checksums do not match their checksum");
    try {
      sums.blocks = nlohmann::json::parse(parsed.metadata.at(kBlockCrcKey));
      sums.block_bytes = std::stoull(get(kBlockBytesKey));
    } catch (const std::exception&) {
      LOCKSTEP_FAIL(path, ": corrupt header (block checksums unreadable)");
    }
    LOCKSTEP_CHECK(sums.blocks.is_object() && sums.block_bytes > 0, path, ": corrupt header (block checksums unreadable)");
  }
  sums.index = get(kIndexCrcKey);
  sums.values = get(kValuesCrcKey);
  get(kValuesKey);
  std::vector<Entry> sorted = parsed.entries;
  std::sort(sorted.begin(), sorted.end(), [](const Entry& a, const Entry& b) { return a.name < b.name; });
  std::string index = index_text(sorted);
  LOCKSTEP_CHECK(hex32(crc32_of(index.data(), index.size())) == sums.index, path,
                 ": corrupt header: the tensor index does not match its checksum");
  const std::string& values = parsed.metadata.at(kValuesKey);
  LOCKSTEP_CHECK(hex32(crc32_of(values.data(), values.size())) == sums.values, path,
                 ": corrupt header: the saved values do not match their checksum");
  return sums;
}

void check_tensor(const Checksums& sums, const Entry& entry, const torch::Tensor& tensor, const std::string& path) {
  LOCKSTEP_CHECK(sums.tensors.contains(entry.name) && sums.tensors[entry.name].is_string(), path,
                 ": no checksum for tensor '", entry.name, "'");
  uint32_t actual = crc32_of(tensor.data_ptr(), entry.end - entry.begin);
  LOCKSTEP_CHECK(hex32(actual) == sums.tensors[entry.name].get<std::string>(), path, ": tensor '", entry.name,
                 "' is corrupt (checksum mismatch)");
}

}  // namespace

void write_checkpoint_file(const std::string& path, const State& state) {
  std::string values = state.values.dump();
  std::map<std::string, std::string> metadata{{"format", kFormat},
                                              {kValuesKey, values},
                                              {kValuesCrcKey, hex32(crc32_of(values.data(), values.size()))}};
  write_tensors(path, state.tensors, std::move(metadata), /*with_checksums=*/true);
}

State read_checkpoint_file(const std::string& path) {
  fault_point("read:" + std::filesystem::path(path).filename().string());
  FileReader file(path);
  ParsedFile parsed = parse_header(file, path);
  Checksums sums = checksums_of(parsed, path);
  State state;
  try {
    state.values = nlohmann::json::parse(parsed.metadata.at(kValuesKey));
  } catch (const nlohmann::json::exception& error) {
    LOCKSTEP_FAIL(path, ": corrupt values (", error.what(), ")");
  }
  for (const auto& entry : parsed.entries) {
    torch::Tensor tensor = read_tensor(file, parsed, entry);
    check_tensor(sums, entry, tensor, path);
    state.tensors[entry.name] = std::move(tensor);
  }
  return state;
}

std::string verify_checkpoint_file(const std::string& path) {
  try {
    FileReader file(path);
    ParsedFile parsed = parse_header(file, path);
    Checksums sums = checksums_of(parsed, path);
    for (const auto& entry : parsed.entries) check_tensor(sums, entry, read_tensor(file, parsed, entry), path);
    return "";
  } catch (const std::exception& error) {
    return error.what();
  }
}

namespace {

// open_checkpoint_file's backend: the header is parsed and verified once; a
// read verifies the blocks it touches (small tensors, and tensors of files
// written before block checksums, are read and verified whole).
class CheckpointFileBackend final : public StateReader::Backend {
 public:
  explicit CheckpointFileBackend(const std::string& path)
      : path_(path), file_(path), parsed_(parse_header(file_, path)), sums_(checksums_of(parsed_, path)) {
    try {
      values_ = nlohmann::json::parse(parsed_.metadata.at(kValuesKey));
    } catch (const nlohmann::json::exception& error) {
      LOCKSTEP_FAIL(path, ": corrupt values (", error.what(), ")");
    }
    for (const auto& entry : parsed_.entries) {
      index_[entry.name] = TensorEntry{entry.dtype, entry.shape};
      entries_[entry.name] = &entry;
    }
  }

  const std::string& source() const override { return path_; }
  const nlohmann::json& values() const override { return values_; }
  const std::map<std::string, TensorEntry>& index() const override { return index_; }
  uint64_t bytes_read() const override { return bytes_read_; }

  torch::Tensor read_elements(const std::string& key, int64_t begin, int64_t count) const override {
    const Entry& entry = *entries_.at(key);
    torch::Tensor out = torch::empty({count}, torch::TensorOptions().dtype(entry.dtype));
    if (count == 0) return out;
    const uint64_t element = c10::elementSize(entry.dtype);
    const uint64_t first = static_cast<uint64_t>(begin) * element;
    const uint64_t last = static_cast<uint64_t>(begin + count) * element;
    const uint64_t size = entry.end - entry.begin;
    auto blocks = sums_.blocks.find(key);
    if (blocks == sums_.blocks.end() || size <= sums_.block_bytes) {
      torch::Tensor whole = read_tensor(file_, parsed_, entry);
      bytes_read_ += size;
      check_tensor(sums_, entry, whole, path_);
      return whole.reshape(-1).narrow(0, begin, count).clone();
    }
    const uint64_t block = sums_.block_bytes;
    LOCKSTEP_CHECK(blocks->is_string() && blocks->get_ref<const std::string&>().size() == 8 * ((size + block - 1) / block),
                   path_, ": corrupt header (the block checksums of tensor '", key, "' do not fit its size)");
    const std::string& hex = blocks->get_ref<const std::string&>();
    const uint64_t from = first / block * block;
    const uint64_t to = std::min(size, (last + block - 1) / block * block);
    std::vector<char> buffer(to - from);
    file_.read_at(parsed_.data_start + entry.begin + from, buffer.data(), to - from);
    bytes_read_ += to - from;
    for (uint64_t at = from; at < to; at += block) {
      const uint64_t length = std::min(block, size - at);
      LOCKSTEP_CHECK(hex32(crc32_of(buffer.data() + (at - from), length)) == hex.substr(8 * (at / block), 8), path_,
                     ": tensor '", key, "' is corrupt (checksum mismatch in its bytes [", at, ", ", at + length, "))");
    }
    std::memcpy(out.data_ptr(), buffer.data() + (first - from), last - first);
    return out;
  }

 private:
  std::string path_;
  FileReader file_;
  ParsedFile parsed_;
  Checksums sums_;
  nlohmann::json values_;
  std::map<std::string, TensorEntry> index_;
  std::map<std::string, const Entry*> entries_;
  mutable std::atomic<uint64_t> bytes_read_{0};
};

}  // namespace

nlohmann::json read_safetensors_header(const std::string& path) {
  return read_header_json(FileReader(path), path).json;
}

StateReader open_checkpoint_file(const std::string& path) {
  return StateReader(std::make_shared<const CheckpointFileBackend>(path));
}

void write_safetensors_file(const std::string& path, const std::map<std::string, torch::Tensor>& tensors,
                            const std::map<std::string, std::string>& metadata) {
  write_tensors(path, tensors, metadata, /*with_checksums=*/false);
}

SafetensorsContent read_safetensors_file(const std::string& path) {
  FileReader file(path);
  ParsedFile parsed = parse_header(file, path);
  SafetensorsContent content;
  content.metadata = parsed.metadata;
  for (const auto& entry : parsed.entries) content.tensors[entry.name] = read_tensor(file, parsed, entry);
  return content;
}

}  // namespace lockstep
