#include "lockstep/checkpoint/zip_archive.h"

#include <cstdint>

#include "lockstep/core/error.h"

namespace lockstep {
namespace {

constexpr uint32_t kEndOfDirectory = 0x06054b50;
constexpr uint32_t kZip64Locator = 0x07064b50;
constexpr uint32_t kZip64EndOfDirectory = 0x06064b50;
constexpr uint32_t kDirectoryEntry = 0x02014b50;
constexpr uint32_t kLocalHeader = 0x04034b50;
constexpr uint64_t kZip64Marker32 = 0xffffffffu;

// Little-endian reads that fail, naming the file, past the end.
class Cursor {
 public:
  Cursor(const std::string& bytes, const std::string& source) : bytes_(bytes), source_(source) {}
  uint64_t at(uint64_t offset, int width) const {
    check(offset <= bytes_.size() && static_cast<uint64_t>(width) <= bytes_.size() - offset, "a field at byte ",
          offset);
    uint64_t value = 0;
    for (int i = 0; i < width; ++i) value |= static_cast<uint64_t>(static_cast<uint8_t>(bytes_[offset + i])) << (8 * i);
    return value;
  }
  template <typename... Args>
  void check(bool ok, Args&&... what) const {
    if (!ok) LOCKSTEP_FAIL(source_, ": not a readable torch.save archive (truncated or damaged?): ",
                           std::forward<Args>(what)..., " lies outside its ", bytes_.size(), " bytes");
  }

 private:
  const std::string& bytes_;
  const std::string& source_;
};

}  // namespace

ZipArchive::ZipArchive(const std::string& bytes, std::string source) : bytes_(bytes), source_(std::move(source)) {
  const Cursor in(bytes_, source_);
  // The end-of-directory record is in the last 22 + 65535 bytes (its comment).
  LOCKSTEP_CHECK(bytes_.size() >= 22, source_, ": not a readable torch.save archive (truncated or damaged?): ",
                 bytes_.size(), " bytes");
  uint64_t end = bytes_.size() - 22;
  const uint64_t lowest = bytes_.size() > 22 + 65535 ? bytes_.size() - 22 - 65535 : 0;
  while (in.at(end, 4) != kEndOfDirectory) {
    LOCKSTEP_CHECK(end > lowest, source_, ": not a readable torch.save archive (truncated or damaged?): "
                   "no zip end-of-directory record");
    --end;
  }
  uint64_t entries = in.at(end + 10, 2);
  uint64_t directory = in.at(end + 16, 4);
  if (directory == kZip64Marker32 || entries == 0xffff) {
    in.check(end >= 20 && in.at(end - 20, 4) == kZip64Locator, "the zip64 locator");
    const uint64_t record = in.at(end - 20 + 8, 8);
    in.check(in.at(record, 4) == kZip64EndOfDirectory, "the zip64 end-of-directory record");
    entries = in.at(record + 32, 8);
    directory = in.at(record + 48, 8);
  }
  in.check(entries <= bytes_.size() / 46, "a directory of ", entries, " entries");
  uint64_t position = directory;
  for (uint64_t e = 0; e < entries; ++e) {
    in.check(in.at(position, 4) == kDirectoryEntry, "directory entry ", e);
    const uint64_t method = in.at(position + 10, 2);
    uint64_t size = in.at(position + 20, 4);  // compressed; equal to the data's size for stored records
    const uint64_t name_length = in.at(position + 28, 2);
    const uint64_t extra_length = in.at(position + 30, 2);
    const uint64_t comment_length = in.at(position + 32, 2);
    uint64_t local = in.at(position + 42, 4);
    in.check(name_length <= bytes_.size() - std::min<uint64_t>(bytes_.size(), position + 46), "entry ", e, "'s name");
    std::string name = bytes_.substr(position + 46, name_length);
    // Zip64 sizes and offset, in the order of the fields that hold the marker.
    uint64_t extra = position + 46 + name_length;
    const uint64_t extra_end = extra + extra_length;
    while (extra + 4 <= extra_end) {
      const uint64_t id = in.at(extra, 2), length = in.at(extra + 2, 2);
      if (id == 0x0001) {
        uint64_t field = extra + 4;
        if (in.at(position + 24, 4) == kZip64Marker32) field += 8;  // uncompressed size
        if (size == kZip64Marker32) {
          size = in.at(field, 8);
          field += 8;
        }
        if (local == kZip64Marker32) local = in.at(field, 8);
      }
      extra += 4 + length;
    }
    // The data follows the local header, whose name and extra field lengths may differ.
    in.check(in.at(local, 4) == kLocalHeader, "the local header of ", name);
    const uint64_t data = local + 30 + in.at(local + 26, 2) + in.at(local + 28, 2);
    in.check(data <= bytes_.size() && size <= bytes_.size() - data, "the data of ", name);
    const size_t slash = name.find('/');
    if (slash != std::string::npos) name = name.substr(slash + 1);
    records_[name] = Record{static_cast<size_t>(data), static_cast<size_t>(size), method == 0};
    position += 46 + name_length + extra_length + comment_length;
  }
}

std::string_view ZipArchive::read(const std::string& name) const {
  auto found = records_.find(name);
  LOCKSTEP_CHECK(found != records_.end(), source_, ": the archive has no record ", name);
  LOCKSTEP_CHECK(found->second.stored, source_, ": record ", name, " is compressed; torch.save stores its records "
                 "uncompressed (was the file re-zipped?)");
  return std::string_view(bytes_).substr(found->second.offset, found->second.size);
}

}  // namespace lockstep
