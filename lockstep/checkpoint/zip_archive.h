// A reader for the zip archives torch.save and torch.jit.save write: stored
// (uncompressed) records, zip64 when large, every record under one top-level
// folder ("archive/data.pkl", "archive/data/0", ...). Every offset and size
// is checked against the bytes at hand, so a truncated or hostile file is an
// error naming it, never a read out of bounds.
//
//   lockstep::ZipArchive archive(bytes, "weights.pt");
//   if (archive.has("data.pkl")) std::string pickle = archive.read("data.pkl");   // names without the folder
#pragma once

#include <map>
#include <string>
#include <string_view>

namespace lockstep {

class ZipArchive {
 public:
  // Indexes the records of `bytes` (kept by reference: it must outlive the archive).
  ZipArchive(const std::string& bytes, std::string source);

  bool has(const std::string& name) const { return records_.count(name) > 0; }
  // The record's bytes; an error naming the source when absent or compressed.
  std::string_view read(const std::string& name) const;

 private:
  struct Record {
    size_t offset = 0;  // of the data, in bytes_
    size_t size = 0;
    bool stored = true;
  };
  const std::string& bytes_;
  std::string source_;
  std::map<std::string, Record> records_;  // by name without the top-level folder
};

}  // namespace lockstep
