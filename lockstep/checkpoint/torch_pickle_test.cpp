// The restricted unpickler on hand-made pickles: what hostile or damaged
// input does (Python-written files are in pt_file_test.cpp).
#include "lockstep/checkpoint/torch_pickle.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tests/support/test_support.h"

namespace lockstep {
namespace {

using ::lockstep::testing::error_of;
using ::testing::AllOf;
using ::testing::HasSubstr;

StorageLoader zeros = [](const std::string&, c10::ScalarType type, int64_t numel) {
  return torch::zeros({numel}, torch::TensorOptions().dtype(type));
};

std::string state_dict_error(const std::string& pickle) {
  return error_of([&] {
    Unpickled file = unpickle_torch_save(pickle, zeros, "x.pt");
    find_state_dict(*file.root, "x.pt");
  });
}

// Pickle pieces, written out by hand.
std::string text(const std::string& value) {  // BINUNICODE
  const uint32_t n = static_cast<uint32_t>(value.size());
  return std::string("X") + static_cast<char>(n & 0xff) + static_cast<char>((n >> 8) & 0xff) +
         static_cast<char>((n >> 16) & 0xff) + static_cast<char>(n >> 24) + value;
}
std::string small(int value) { return std::string("K") + static_cast<char>(value); }  // BININT1
std::string global(const std::string& module, const std::string& name) { return "c" + module + "\n" + name + "\n"; }
const std::string kProto = "\x80\x02";

// {'w': _rebuild_tensor_v2(('storage', torch.FloatStorage, '0', 'cpu', 4), offset, (2,), (stride,), False, None)}
std::string one_tensor_dict(int offset, int stride) {
  const std::string storage = "(" + text("storage") + global("torch", "FloatStorage") + text("0") + text("cpu") +
                              small(4) + "tQ";
  const std::string args = "(" + storage + small(offset) + small(2) + "\x85" + small(stride) + "\x85" + "\x89" + "N" + "t";
  return kProto + "}(" + text("w") + global("torch._utils", "_rebuild_tensor_v2") + args + "Ru.";
}

TEST(TorchPickle, ATensorDictRebuildsItsViews) {
  Unpickled file = unpickle_torch_save(one_tensor_dict(1, 2), zeros, "x.pt");
  auto weights = find_state_dict(*file.root, "x.pt");
  ASSERT_EQ(weights.count("w"), 1u);
  EXPECT_EQ(weights.at("w").sizes(), (std::vector<int64_t>{2}));
}

TEST(TorchPickle, AViewReachingPastItsStorageIsRefused) {
  // offset 1, stride 3: elements 1 and 4 of a 4-element storage.
  EXPECT_THAT(state_dict_error(one_tensor_dict(1, 3)), AllOf(HasSubstr("x.pt"), HasSubstr("outside its storage")));
}

TEST(TorchPickle, ACycleIsNeitherFollowedNorLeaked) {
  // l = []; l.append(l): a list that holds itself.
  EXPECT_THAT(state_dict_error(kProto + "]q" + std::string(1, '\0') + "h" + std::string(1, '\0') + "a."),
              HasSubstr("holds a list of 1"));
}

TEST(TorchPickle, DamagedPicklesNameTheByte) {
  EXPECT_THAT(state_dict_error(kProto + "h\x05."), AllOf(HasSubstr("byte 2"), HasSubstr("memo entry 5")));
  EXPECT_THAT(state_dict_error(kProto + text("abcdef").substr(0, 8)), HasSubstr("truncated"));
  EXPECT_THAT(state_dict_error(kProto + "\xff"), HasSubstr("pickle opcode 0xff"));
  EXPECT_THAT(state_dict_error(kProto + "t."), HasSubstr("no MARK"));
  EXPECT_THAT(state_dict_error(kProto + "}}."), HasSubstr("2 values on its stack"));
}

TEST(TorchPickle, UnknownClassesAreNamedNotRun) {
  // os.system('echo owned'): named, never called.
  const std::string pickle = kProto + global("os", "system") + text("echo owned") + "\x85R.";
  EXPECT_THAT(state_dict_error(pickle), AllOf(HasSubstr("os.system object"), HasSubstr("pickled Python object")));
}

}  // namespace
}  // namespace lockstep
