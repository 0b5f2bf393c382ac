// Round trips through lockstep's own DCP writer and reader, and the errors
// of damaged checkpoints. The checks against PyTorch's dcp.save and dcp.load
// (sharded at 3 ranks with FSDP2) are tests/differential/dcp_pytorch_test.cpp.
#include "lockstep/checkpoint/dcp_checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "tests/support/same_tensors.h"
#include "tests/support/test_support.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;
using testing::error_of;
using ::testing::AllOf;
using ::testing::HasSubstr;

std::map<std::string, torch::Tensor> assorted_tensors() {
  torch::manual_seed(3);
  return {{"conv.weight", torch::randn({4, 3, 3, 3})},
          {"fc.bias", torch::randn({5}, torch::kDouble)},
          {"half", torch::randn({7}).to(torch::kBFloat16)},
          {"steps", torch::tensor(int64_t{12345678901})},  // 0-dim
          {"mask", torch::rand({2, 3}) > 0.5},
          {"empty", torch::zeros({0, 4}, torch::kInt)},
          {"transposed", torch::arange(12, torch::kFloat).reshape({3, 4}).t()}};
}

// What reading the checkpoint `dir`/ckpt says.
std::string reading_error(const testing::TempDir& dir) {
  return error_of([&] { read_dcp_state_dict(dir.file("ckpt")); });
}

// Replaces `from` by `to` (the same length) in `path`'s bytes, so the pickle stays well formed.
void patch_file(const std::string& path, const std::string& from, const std::string& to) {
  ASSERT_EQ(from.size(), to.size());
  std::string bytes = testing::read_file(path);
  const size_t at = bytes.find(from);
  ASSERT_NE(at, std::string::npos) << from;
  bytes.replace(at, from.size(), to);
  testing::write_file(path, bytes);
}

TEST(DcpCheckpoint, RoundTripKeepsNamesDtypesShapesAndBits) {
  testing::TempDir dir;
  const auto tensors = assorted_tensors();
  write_dcp_state_dict(tensors, dir.file("ckpt"));
  EXPECT_TRUE(fs::exists(dir.file("ckpt/.metadata")));
  EXPECT_TRUE(fs::exists(dir.file("ckpt/__0_0.distcp")));
  EXPECT_TRUE(testing::same_tensors(read_dcp_state_dict(dir.file("ckpt/")), tensors));
}

TEST(DcpCheckpoint, AnEmptyStateDictRoundTrips) {
  testing::TempDir dir;
  write_dcp_state_dict({}, dir.file("ckpt"));
  EXPECT_TRUE(read_dcp_state_dict(dir.file("ckpt")).empty());
}

TEST(DcpCheckpoint, WritingOverACheckpointReplacesItWholeAndLeavesNothingBeside) {
  testing::TempDir dir;
  write_dcp_state_dict(assorted_tensors(), dir.file("ckpt"));
  testing::write_file(dir.file("ckpt/stray"), "from before");
  const std::map<std::string, torch::Tensor> second{{"w", torch::ones({2, 2})}};
  write_dcp_state_dict(second, dir.file("ckpt"));
  EXPECT_TRUE(testing::same_tensors(read_dcp_state_dict(dir.file("ckpt")), second));
  EXPECT_FALSE(fs::exists(dir.file("ckpt/stray")));
  size_t entries = 0;
  for (const auto& entry : fs::directory_iterator(dir.path())) entries += entry.path().filename() == "ckpt" ? 0 : 1;
  EXPECT_EQ(entries, 0u) << "a staging directory was left beside the checkpoint";
}

TEST(DcpCheckpoint, AFailedWriteLeavesTheEarlierCheckpointWhole) {
  testing::TempDir dir;
  const auto tensors = assorted_tensors();
  write_dcp_state_dict(tensors, dir.file("ckpt"));
  const std::map<std::string, torch::Tensor> unwritable{{"ok", torch::ones({2})},
                                                        {"odd", torch::empty({2}, torch::kComplexHalf)}};
  EXPECT_THAT(error_of([&] { write_dcp_state_dict(unwritable, dir.file("ckpt")); }),
              AllOf(HasSubstr("'odd'"), HasSubstr("ComplexHalf")));
  EXPECT_TRUE(testing::same_tensors(read_dcp_state_dict(dir.file("ckpt")), tensors));
}

TEST(DcpCheckpoint, ADirectoryWithoutMetadataIsAnErrorNamingIt) {
  testing::TempDir dir;
  fs::create_directories(dir.file("half"));
  EXPECT_THAT(error_of([&] { read_dcp_state_dict(dir.file("half")); }),
              AllOf(HasSubstr(dir.file("half")), HasSubstr("no .metadata")));
  EXPECT_THAT(error_of([&] { read_dcp_state_dict(dir.file("nowhere")); }), HasSubstr("not a directory"));
}

TEST(DcpCheckpoint, ATruncatedDataFileIsAnErrorNamingTheFileAndTheTensor) {
  testing::TempDir dir;
  write_dcp_state_dict(assorted_tensors(), dir.file("ckpt"));
  const std::string data = dir.file("ckpt/__0_0.distcp");
  fs::resize_file(data, fs::file_size(data) / 2);
  EXPECT_THAT(reading_error(dir), AllOf(HasSubstr(data), HasSubstr("past the file's end")));
}

TEST(DcpCheckpoint, AnUnknownDtypeIsAnErrorNamingTheTensorAndTheDtype) {
  testing::TempDir dir;
  write_dcp_state_dict({{"w", torch::ones({2})}}, dir.file("ckpt"));
  patch_file(dir.file("ckpt/.metadata"), "torch\nfloat32\n", "torch\nfloat99\n");
  EXPECT_THAT(reading_error(dir), AllOf(HasSubstr(".metadata"), HasSubstr("'w' has dtype torch.float99")));
}

TEST(DcpCheckpoint, AChunkFileOutsideTheDirectoryIsRefused) {
  testing::TempDir dir;
  write_dcp_state_dict({{"w", torch::ones({2})}}, dir.file("ckpt"));
  patch_file(dir.file("ckpt/.metadata"), "__0_0.distcp", "../_0.distcp");
  EXPECT_THAT(reading_error(dir), HasSubstr("'../_0.distcp' is not a name inside"));
}

TEST(DcpCheckpoint, AChunkWhoseRecordHoldsAnotherShapeIsAnError) {
  testing::TempDir dir;
  testing::TempDir other;
  write_dcp_state_dict({{"a", torch::ones({2, 3})}, {"b", torch::ones({3, 2})}}, dir.file("ckpt"));
  write_dcp_state_dict({{"a", torch::ones({3, 2})}, {"b", torch::ones({2, 3})}}, other.file("ckpt"));
  // The other's data file: its records have the same lengths, and each the other shape.
  testing::write_file(dir.file("ckpt/__0_0.distcp"), testing::read_file(other.file("ckpt/__0_0.distcp")));
  EXPECT_THAT(reading_error(dir),
              AllOf(HasSubstr("the chunk of 'a' at offsets [0, 0]"), HasSubstr("the metadata says Float [2, 3]")));
}

TEST(DcpCheckpoint, AMetadataFileThatIsNotDcpsIsAnError) {
  testing::TempDir dir;
  write_dcp_state_dict({{"w", torch::ones({2})}}, dir.file("ckpt"));
  testing::write_file(dir.file("ckpt/.metadata"), std::string("\x80\x02}q\x00.", 6));  // pickle.dumps({})
  EXPECT_THAT(reading_error(dir), AllOf(HasSubstr(dir.file("ckpt/.metadata")),
                                        HasSubstr("not the metadata of a torch.distributed.checkpoint")));
  testing::write_file(dir.file("ckpt/.metadata"), "garbage");
  EXPECT_THAT(reading_error(dir), HasSubstr(dir.file("ckpt/.metadata")));
}

// ---- several writers, boxes, objects -------------------------------------------

// The tensor's flat elements [begin, begin + count), as dcp_boxes_of_range cuts them.
torch::Tensor through_boxes(const torch::Tensor& whole, int64_t begin, int64_t count) {
  torch::Tensor flat = torch::full({count}, -1.0, whole.options());
  for (const DcpBox& box : dcp_boxes_of_range(whole.sizes().vec(), begin, count)) {
    torch::Tensor part = whole;
    for (size_t d = 0; d < box.offsets.size(); ++d) part = part.narrow(static_cast<int64_t>(d), box.offsets[d], box.sizes[d]);
    flat.narrow(0, box.flat_begin, part.numel()).copy_(part.reshape(-1));
  }
  return flat;
}

TEST(DcpBoxes, AnyFlatRangeIsCutIntoBoxesThatHoldExactlyIt) {
  const torch::Tensor whole = torch::arange(3 * 4 * 5, torch::kFloat).reshape({3, 4, 5});
  for (int64_t begin = 0; begin <= 60; begin += 7) {
    for (int64_t count : {0, 1, 4, 5, 13, 20, 33}) {
      if (begin + count > 60) continue;
      EXPECT_TRUE(torch::equal(through_boxes(whole, begin, count), whole.reshape(-1).narrow(0, begin, count)))
          << "[" << begin << ", +" << count << ")";
    }
  }
  EXPECT_EQ(dcp_boxes_of_range({3, 4, 5}, 20, 40).size(), 1u) << "whole rows are one box";
  EXPECT_EQ(dcp_boxes_of_range({}, 0, 1).size(), 1u) << "a 0-dim tensor's one element";
  EXPECT_TRUE(dcp_boxes_of_range({6}, 2, 0).empty());
}

// Three "ranks" each write their flat third of each tensor (cut mid-row),
// then the metadata: the reader puts every tensor together, reads any box of
// it, and reads back the objects.
TEST(DcpCheckpoint, SeveralWritersBoxesAndObjectsRoundTrip) {
  testing::TempDir dir;
  fs::create_directories(dir.file("ckpt"));
  torch::manual_seed(5);
  const std::map<std::string, torch::Tensor> tensors{{"model.w", torch::randn({7, 5})},
                                                     {"model.b", torch::randn({4}, torch::kDouble)}};
  std::vector<nlohmann::json> records;
  for (int rank = 0; rank < 3; ++rank) {
    DcpRankPart part;
    for (const auto& [name, tensor] : tensors) {
      const int64_t per = (tensor.numel() + 2) / 3;
      const int64_t begin = std::min(tensor.numel(), rank * per), count = std::min(per, tensor.numel() - begin);
      for (const DcpBox& box : dcp_boxes_of_range(tensor.sizes().vec(), begin, count)) {
        torch::Tensor values = tensor;
        for (size_t d = 0; d < box.offsets.size(); ++d) {
          values = values.narrow(static_cast<int64_t>(d), box.offsets[d], box.sizes[d]);
        }
        part.tensors.push_back({nlohmann::json::array({"model", name.substr(6)}), tensor.sizes().vec(), box.offsets, values});
      }
    }
    if (rank == 0) {
      part.objects.push_back({nlohmann::json::array({"optim", "param_groups", 0, "lr"}), c10::IValue(0.25)});
      part.objects.push_back({nlohmann::json::array({"optim", "param_groups", 0, "betas"}),
                              c10::ivalue::Tuple::create({c10::IValue(0.9), c10::IValue(0.99)})});
      part.objects.push_back({nlohmann::json::array({"optim", "param_groups", 0, "foreach"}), c10::IValue()});
      part.objects.push_back({nlohmann::json::array({"optim", "param_groups", 0, "params"}),
                              c10::IValue(c10::List<std::string>({"w", "b"}))});
    }
    records.push_back(write_dcp_rank_file(dir.file("ckpt"), rank, part));
  }
  write_dcp_metadata(dir.file("ckpt"), records);
  EXPECT_TRUE(testing::same_tensors(read_dcp_state_dict(dir.file("ckpt")), tensors));
  const DcpReader reader(dir.file("ckpt"));
  EXPECT_TRUE(torch::equal(reader.read_box("model.w", {2, 1}, {4, 3}), tensors.at("model.w").slice(0, 2, 6).slice(1, 1, 4)));
  EXPECT_EQ(reader.object_names().size(), 4u);
  using Kind = PickleValue::Kind;
  EXPECT_EQ(reader.read_object("optim.param_groups.0.lr").root->real, 0.25);
  const Unpickled betas = reader.read_object("optim.param_groups.0.betas");
  ASSERT_EQ(betas.root->kind, Kind::kTuple);
  EXPECT_EQ(betas.root->items.at(1)->real, 0.99);
  EXPECT_EQ(reader.read_object("optim.param_groups.0.foreach").root->kind, Kind::kNone);
  const Unpickled params = reader.read_object("optim.param_groups.0.params");
  ASSERT_EQ(params.root->kind, Kind::kList);
  EXPECT_EQ(params.root->items.at(1)->text, "b");
}

TEST(DcpCheckpoint, BoxesThatLeaveATensorUncoveredOrOverlapAreRefusedNamingIt) {
  testing::TempDir dir;
  fs::create_directories(dir.file("ckpt"));
  const torch::Tensor w = torch::ones({4, 2});
  DcpRankPart first, second;
  first.tensors.push_back({nlohmann::json::array({"model", "w"}), {4, 2}, {0, 0}, w.slice(0, 0, 2)});
  second.tensors.push_back({nlohmann::json::array({"model", "w"}), {4, 2}, {1, 0}, w.slice(0, 1, 3)});
  const auto records = std::vector<nlohmann::json>{write_dcp_rank_file(dir.file("ckpt"), 0, first),
                                                   write_dcp_rank_file(dir.file("ckpt"), 1, second)};
  EXPECT_THAT(error_of([&] { write_dcp_metadata(dir.file("ckpt"), records); }),
              AllOf(HasSubstr("two chunks of 'model.w' overlap")));
  EXPECT_THAT(error_of([&] { write_dcp_metadata(dir.file("ckpt"), {records[0]}); }),
              HasSubstr("the chunks of 'model.w' hold 4 elements of its 8"));
  EXPECT_FALSE(fs::exists(dir.file("ckpt/.metadata")));
  DcpRankPart outside;
  outside.tensors.push_back({nlohmann::json::array({"model", "w"}), {4, 2}, {3, 0}, w.slice(0, 0, 2)});
  EXPECT_THAT(error_of([&] { write_dcp_rank_file(dir.file("ckpt"), 2, outside); }),
              HasSubstr("does not fit its size [4, 2]"));
}

}  // namespace
}  // namespace lockstep
