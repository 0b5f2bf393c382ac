#include "lockstep/checkpoint/internal/dcp_format.h"

#include "lockstep/core/error.h"

namespace lockstep::dcp_format {

namespace fs = std::filesystem;

const std::vector<std::pair<c10::ScalarType, std::string>>& dtype_names() {
  static const std::vector<std::pair<c10::ScalarType, std::string>> names{
      {c10::kFloat, "float32"},     {c10::kDouble, "float64"},       {c10::kHalf, "float16"},
      {c10::kBFloat16, "bfloat16"}, {c10::kLong, "int64"},           {c10::kInt, "int32"},
      {c10::kShort, "int16"},       {c10::kChar, "int8"},            {c10::kByte, "uint8"},
      {c10::kBool, "bool"},         {c10::kComplexFloat, "complex64"}, {c10::kComplexDouble, "complex128"}};
  return names;
}

int64_t volume(const std::vector<int64_t>& sizes) {
  int64_t n = 1;
  for (int64_t size : sizes) n *= size;
  return n;
}

std::string dims_text(const std::vector<int64_t>& dims) { return str_cat(c10::IntArrayRef(dims)); }

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

fs::path directory_path(const std::string& dir) {
  std::string trimmed = dir;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  return fs::path(trimmed);
}

}  // namespace lockstep::dcp_format
