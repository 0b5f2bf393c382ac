#include "lockstep/data/idx_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "lockstep/data/testdata/idx_fixture.h"

namespace lockstep {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using namespace lockstep::testing;  // the IDX fixture, TempDir and write_file

std::string error_of(const std::string& path, uint32_t expected_magic = 0) {
  try {
    read_idx_file(path, expected_magic);
  } catch (const Error& error) {
    return error.what();
  }
  ADD_FAILURE() << "reading " << path << " did not fail";
  return "";
}

// The same bytes, once raw and once gzipped: every reader check must hold for both.
class IdxFileTest : public ::testing::TestWithParam<bool> {
 protected:
  std::string write(const std::string& name, const std::string& bytes) {
    if (GetParam()) {
      write_gzip_file(dir_.file(name + ".gz"), bytes);
      return dir_.file(name + ".gz");
    }
    write_file(dir_.file(name), bytes);
    return dir_.file(name);
  }
  TempDir dir_;
};

TEST_P(IdxFileTest, ReadsImagesInHeaderShape) {
  const auto path = write("images", idx_bytes(kIdxImagesMagic, {3, 2, 4}, ramp(24)));
  torch::Tensor images = read_idx_file(path, kIdxImagesMagic);
  EXPECT_EQ(images.scalar_type(), torch::kUInt8);
  EXPECT_EQ(images.sizes(), (std::vector<int64_t>{3, 2, 4}));
  // Row-major: element [i][r][c] is byte 8i + 4r + c.
  EXPECT_EQ(images[2][1][3].item<int>(), 23);
  EXPECT_EQ(images[1][0][2].item<int>(), 10);
  EXPECT_TRUE(torch::equal(images.flatten(), torch::arange(24).to(torch::kUInt8)));
}

TEST_P(IdxFileTest, ReadsLabelsAndBytesAbove127) {
  const auto path = write("labels", idx_bytes(kIdxLabelsMagic, {3}, std::string("\x09\x00\xff", 3)));
  torch::Tensor labels = read_idx_file(path, kIdxLabelsMagic);
  EXPECT_EQ(labels.sizes(), (std::vector<int64_t>{3}));
  EXPECT_EQ(labels[0].item<int>(), 9);
  EXPECT_EQ(labels[1].item<int>(), 0);
  EXPECT_EQ(labels[2].item<int>(), 255);
}

TEST_P(IdxFileTest, EmptyPayloadIsFine) {
  const auto path = write("empty", idx_bytes(kIdxImagesMagic, {0, 28, 28}, ""));
  EXPECT_EQ(read_idx_file(path).sizes(), (std::vector<int64_t>{0, 28, 28}));
}

TEST_P(IdxFileTest, TruncatedPayloadNamesFileAndCounts) {
  const auto path = write("short", idx_bytes(kIdxImagesMagic, {3, 2, 2}, ramp(5)));
  EXPECT_EQ(error_of(path), path + ": truncated: header says 3x2x2 = 12 bytes, file holds 5");
}

TEST_P(IdxFileTest, HugeClaimInATinyFileIsTruncatedNotAllocated) {
  // 2.16 GB announced, 10 bytes present (found by fuzz_idx): memory follows the data.
  const auto path = write("huge", idx_bytes(kIdxImagesMagic, {60000, 6000, 6}, ramp(10)));
  EXPECT_EQ(error_of(path), path + ": truncated: header says 60000x6000x6 = 2160000000 bytes, file holds 10");
}

TEST_P(IdxFileTest, TrailingBytesAreAnError) {
  const auto path = write("long", idx_bytes(kIdxImagesMagic, {3, 2, 2}, ramp(14)));
  EXPECT_EQ(error_of(path), path + ": 2 trailing bytes: header says 3x2x2 = 12 bytes, file holds 14");
}

TEST_P(IdxFileTest, WrongKindOfFile) {
  const auto path = write("labels", idx_bytes(kIdxLabelsMagic, {4}, ramp(4)));
  const std::string message = error_of(path, kIdxImagesMagic);
  EXPECT_THAT(message, HasSubstr(path + ": wrong magic number 0x00000801, expected 0x00000803"));
}

TEST_P(IdxFileTest, NotAnIdxFile) {
  const auto path = write("text", "hello, this is not IDX data");
  EXPECT_THAT(error_of(path), HasSubstr(path + ": not an IDX file: bad magic number 0x68656C6C"));
  const auto tiny = write("tiny", "ab");
  EXPECT_EQ(error_of(tiny), tiny + ": not an IDX file: it holds only 2 bytes, too few for a header");
}

TEST_P(IdxFileTest, UnsupportedElementType) {
  const auto path = write("floats", idx_bytes(0x00000D01, {1}, ramp(4)));
  EXPECT_THAT(error_of(path), HasSubstr(path + ": unsupported IDX element type 0x0000000D"));
}

TEST_P(IdxFileTest, TruncatedDimensions) {
  // Magic for 3 dimensions, but only one size follows.
  const auto path = write("dims", idx_bytes(kIdxImagesMagic, {60000}, ""));
  EXPECT_THAT(error_of(path), HasSubstr(path + ": truncated header: magic 0x00000803 announces 3 dimensions"));
}

INSTANTIATE_TEST_SUITE_P(RawAndGzipped, IdxFileTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) { return info.param ? "gz" : "raw"; });

TEST(IdxFile, MissingFileNamesThePath) {
  TempDir dir;
  const std::string path = dir.file("nowhere/train-images-idx3-ubyte.gz");
  EXPECT_THAT(error_of(path), AllOf(HasSubstr(path + ": cannot open"), HasSubstr("No such file")));
}

TEST(IdxFile, GzipStreamCutShort) {
  TempDir dir;
  const std::string path = dir.file("cut.gz");
  // Incompressible-ish content so the compressed stream is long enough to cut.
  std::string payload(4000, '\0');
  uint32_t state = 12345;
  for (auto& byte : payload) {
    state = state * 1103515245u + 12345u;
    byte = static_cast<char>(state >> 24);
  }
  write_gzip_file(path, idx_bytes(kIdxImagesMagic, {10, 20, 20}, payload));
  const std::string whole = testing::read_file(path);
  write_file(path, whole.substr(0, whole.size() / 2));
  EXPECT_THAT(error_of(path), AllOf(HasSubstr(path + ": truncated: header says 10x20x20 = 4000 bytes, file holds "),
                                    HasSubstr("the gzip stream ends early")));
}

TEST(IdxFile, CorruptGzipData) {
  TempDir dir;
  const std::string path = dir.file("corrupt.gz");
  write_gzip_file(path, idx_bytes(kIdxImagesMagic, {10, 20, 20}, std::string(4000, '\x11')));
  std::string bytes = testing::read_file(path);
  // Keep the 10-byte gzip header, spoil the deflate data after it.
  for (size_t i = 10; i < bytes.size() && i < 40; ++i) bytes[i] = '\xff';
  write_file(path, bytes);
  EXPECT_THAT(error_of(path), HasSubstr(path + ": cannot read (corrupt gzip data?)"));
}

}  // namespace
}  // namespace lockstep
