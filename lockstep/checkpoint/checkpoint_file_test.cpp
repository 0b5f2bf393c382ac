#include "lockstep/checkpoint/checkpoint_file.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include "lockstep/core/atomic_file.h"
#include "lockstep/core/error.h"
#include "tests/support/test_support.h"

namespace lockstep {
namespace {

State sample_state() {
  State state;
  torch::manual_seed(3);
  state.tensors["model/fc.weight"] = torch::randn({3, 4});
  state.tensors["model/fc.bias"] = torch::randn({3}, torch::kFloat64);
  state.tensors["model/bn.num_batches_tracked"] = torch::tensor(17, torch::kLong);
  state.tensors["optim/half"] = torch::randn({5}).to(torch::kHalf);
  state.tensors["optim/brain"] = torch::randn({2, 2}).to(torch::kBFloat16);
  state.tensors["mask"] = torch::tensor({true, false, true});
  state.tensors["bytes"] = torch::arange(250, torch::kUInt8);
  state.tensors["empty"] = torch::zeros({0, 7});
  // Empty tensors sit at the offset where the next one starts, whatever order the names give them.
  state.tensors["model/a_empty"] = torch::zeros({0});
  state.tensors["model/zz_empty"] = torch::zeros({0});
  state.values["iteration"] = 999;
  state.values["lr"] = 0.1 + 0.2;  // not representable exactly in decimal with few digits
  state.values["nested"] = {{"name", "sgd"}, {"list", {1, 2, 3}}};
  return state;
}

void expect_equal(const State& a, const State& b) {
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (const auto& [name, tensor] : a.tensors) {
    const auto& other = b.tensors.at(name);
    EXPECT_EQ(tensor.scalar_type(), other.scalar_type()) << name;
    EXPECT_EQ(tensor.sizes(), other.sizes()) << name;
    EXPECT_TRUE(torch::equal(tensor, other)) << name;
  }
  EXPECT_EQ(a.values, b.values);
}

TEST(CheckpointFileTest, RoundTripIsExact) {
  testing::TempDir dir;
  State state = sample_state();
  write_checkpoint_file(dir.file("a.ckpt"), state);
  State loaded = read_checkpoint_file(dir.file("a.ckpt"));
  expect_equal(state, loaded);
  EXPECT_EQ(loaded.values["lr"].get<double>(), 0.1 + 0.2);
  EXPECT_EQ(verify_checkpoint_file(dir.file("a.ckpt")), "");
}

TEST(CheckpointFileTest, EveryFlippedByteIsDetected) {
  testing::TempDir dir;
  write_checkpoint_file(dir.file("a.ckpt"), sample_state());
  const std::string original = testing::read_file(dir.file("a.ckpt"));
  // Flip each byte in turn: whatever part it hits (length, JSON, checksums,
  // tensor data), the file must not load silently.
  int undetected = 0;
  for (size_t i = 0; i < original.size(); ++i) {
    std::string corrupt = original;
    corrupt[i] = static_cast<char>(corrupt[i] ^ 0x5a);
    testing::write_file(dir.file("b.ckpt"), corrupt);
    if (verify_checkpoint_file(dir.file("b.ckpt")).empty()) {
      // Whitespace padding of the header may change harmlessly only to other whitespace; 0x20^0x5a is 'z'.
      ++undetected;
      ADD_FAILURE() << "flipping byte " << i << " went unnoticed";
    }
  }
  EXPECT_EQ(undetected, 0);
}

TEST(CheckpointFileTest, CorruptTensorIsNamed) {
  testing::TempDir dir;
  State state;
  state.tensors["model/w"] = torch::ones({1024});
  write_checkpoint_file(dir.file("a.ckpt"), state);
  std::string bytes = testing::read_file(dir.file("a.ckpt"));
  bytes[bytes.size() - 100] ^= 1;
  testing::write_file(dir.file("a.ckpt"), bytes);
  try {
    read_checkpoint_file(dir.file("a.ckpt"));
    FAIL();
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("tensor 'model/w' is corrupt"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("a.ckpt"), std::string::npos) << error.what();
  }
}

TEST(CheckpointFileReaderTest, PartsAndSlicesEqualTheWholeRead) {
  testing::TempDir dir;
  State state = sample_state();
  state.tensors["model/big"] = torch::randn({1000, 1000});  // 4 MB: 62 blocks of 64 KiB
  write_checkpoint_file(dir.file("a.ckpt"), state);
  StateReader file = open_checkpoint_file(dir.file("a.ckpt"));
  EXPECT_EQ(file.values(), state.values);
  StateReader model = file.part("model");
  EXPECT_EQ(model.keys(), (std::vector<std::string>{"a_empty", "big", "bn.num_batches_tracked", "fc.bias", "fc.weight", "zz_empty"}));
  EXPECT_TRUE(torch::equal(model.read("fc.weight"), state.tensors.at("model/fc.weight")));
  EXPECT_EQ(model.entry("fc.bias").dtype, torch::kFloat64);
  EXPECT_TRUE(torch::equal(file.part("optim").read("brain"), state.tensors.at("optim/brain")));
  EXPECT_EQ(file.read("empty").sizes(), state.tensors.at("empty").sizes());
  EXPECT_FALSE(file.part("nothing").contains("x"));

  // 100 elements out of a million: the blocks they touch, not the tensor.
  const uint64_t before = file.bytes_read();
  torch::Tensor slice = model.read_elements("big", 500000, 100);
  EXPECT_TRUE(torch::equal(slice, state.tensors.at("model/big").reshape(-1).narrow(0, 500000, 100)));
  EXPECT_LE(file.bytes_read() - before, 2u * 64 * 1024);
  // Across a block boundary, and the very end.
  EXPECT_TRUE(torch::equal(model.read_elements("big", 16380, 10),
                           state.tensors.at("model/big").reshape(-1).narrow(0, 16380, 10)));
  EXPECT_TRUE(torch::equal(model.read_elements("big", 999990, 10),
                           state.tensors.at("model/big").reshape(-1).narrow(0, 999990, 10)));
  EXPECT_TRUE(torch::equal(model.read("big"), state.tensors.at("model/big")));
  EXPECT_THROW(model.read_elements("big", 999995, 10), Error);
  EXPECT_THROW(model.read("missing"), Error);
  // The whole-tensor checksum is the blocks' combined: the file reads back as before.
  expect_equal(read_checkpoint_file(dir.file("a.ckpt")), state);
}

TEST(CheckpointFileReaderTest, ACorruptBlockIsFoundByTheReadsThatTouchIt) {
  testing::TempDir dir;
  State state;
  state.tensors["model/big"] = torch::arange(200000, torch::kFloat32);  // 800 KB, 13 blocks
  write_checkpoint_file(dir.file("a.ckpt"), state);
  std::string bytes = testing::read_file(dir.file("a.ckpt"));
  bytes[bytes.size() - 10] ^= 1;  // in the last block
  testing::write_file(dir.file("a.ckpt"), bytes);
  StateReader model = open_checkpoint_file(dir.file("a.ckpt")).part("model");
  EXPECT_TRUE(torch::equal(model.read_elements("big", 0, 1000), torch::arange(1000, torch::kFloat32)));
  try {
    model.read_elements("big", 199000, 1000);
    FAIL();
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("tensor 'model/big' is corrupt (checksum mismatch in its bytes [786432, 800000))"),
              std::string::npos)
        << error.what();
    EXPECT_NE(std::string(error.what()).find("a.ckpt"), std::string::npos) << error.what();
  }
  EXPECT_NE(verify_checkpoint_file(dir.file("a.ckpt")), "");
}

TEST(CheckpointFileTest, TruncationAndGarbageGiveClearErrors) {
  testing::TempDir dir;
  write_checkpoint_file(dir.file("a.ckpt"), sample_state());
  std::string bytes = testing::read_file(dir.file("a.ckpt"));
  for (size_t keep : {size_t{0}, size_t{5}, size_t{8}, size_t{40}, bytes.size() / 2, bytes.size() - 1}) {
    testing::write_file(dir.file("t.ckpt"), bytes.substr(0, keep));
    std::string fault = verify_checkpoint_file(dir.file("t.ckpt"));
    EXPECT_NE(fault, "") << "truncated to " << keep;
    EXPECT_NE(fault.find("t.ckpt"), std::string::npos) << fault;
  }
  testing::write_file(dir.file("g.ckpt"), bytes + "junk");
  EXPECT_NE(verify_checkpoint_file(dir.file("g.ckpt")).find("trailing"), std::string::npos);
  EXPECT_NE(verify_checkpoint_file(dir.file("missing.ckpt")).find("missing.ckpt: no such file"), std::string::npos);
  std::filesystem::create_directory(dir.file("d.ckpt"));
  EXPECT_NE(verify_checkpoint_file(dir.file("d.ckpt")).find("d.ckpt: not a file"), std::string::npos);
}

TEST(CheckpointFileTest, PlainSafetensorsRoundTrip) {
  testing::TempDir dir;
  std::map<std::string, torch::Tensor> tensors{{"fc.weight", torch::randn({2, 3})}, {"fc.bias", torch::randn({2})}};
  write_safetensors_file(dir.file("m.safetensors"), tensors, {{"format", "pt"}});
  auto content = read_safetensors_file(dir.file("m.safetensors"));
  EXPECT_EQ(content.metadata.at("format"), "pt");
  for (const auto& [name, tensor] : tensors) EXPECT_TRUE(torch::equal(content.tensors.at(name), tensor));
  // A plain safetensors file is not a lockstep checkpoint.
  EXPECT_NE(verify_checkpoint_file(dir.file("m.safetensors")).find("not a lockstep checkpoint"), std::string::npos);
}

// An independent reader: numpy parses the file by the safetensors spec.
TEST(CheckpointFileTest, NumpyReadsTheSameValues) {
  if (testing::run_command({testing::python(), "-c", "import numpy"}).exit_code != 0) {
    GTEST_SKIP() << "python3-numpy is not installed";
  }
  testing::TempDir dir;
  State state;
  state.tensors["model/w"] = torch::arange(12, torch::kFloat32).view({3, 4}) / 7;
  state.tensors["model/i"] = torch::tensor({-3, 5}, torch::kLong);
  state.values["iteration"] = 41;
  write_checkpoint_file(dir.file("a.ckpt"), state);
  const std::string script = R"PY(
import json, struct, sys, numpy as np
data = open(sys.argv[1], 'rb').read()
(n,) = struct.unpack('<Q', data[:8])
header = json.loads(data[8:8 + n])
base = 8 + n
types = {'F32': np.float32, 'I64': np.int64}
for name in sorted(k for k in header if k != '__metadata__'):
    e = header[name]
    b, end = e['data_offsets']
    a = np.frombuffer(data[base + b: base + end], dtype=types[e['dtype']]).reshape(e['shape'])
    print(name, ' '.join(repr(float(x)) for x in a.ravel()))
print('iteration', json.loads(header['__metadata__']['lockstep.values'])['iteration'])
)PY";
  testing::write_file(dir.file("read.py"), script);
  auto result = testing::run_command({testing::python(), dir.file("read.py"), dir.file("a.ckpt")});
  ASSERT_EQ(result.exit_code, 0) << result.output;
  std::ostringstream expected;
  expected << "model/i -3.0 5.0\nmodel/w";
  auto w = state.tensors["model/w"].flatten();
  for (int64_t i = 0; i < w.numel(); ++i) {
    char buffer[64];
    std::snprintf(buffer, sizeof(buffer), " %.17g", static_cast<double>(w[i].item<float>()));
    expected << buffer;
  }
  expected << "\niteration 41\n";
  // Python's repr prints the shortest round-trip text; compare numerically instead.
  std::istringstream got(result.output), want(expected.str());
  std::string got_token, want_token;
  while (want >> want_token) {
    ASSERT_TRUE(static_cast<bool>(got >> got_token)) << result.output;
    char* end = nullptr;
    double want_value = std::strtod(want_token.c_str(), &end);
    if (end != want_token.c_str() && *end == '\0') {
      EXPECT_EQ(std::strtod(got_token.c_str(), nullptr), want_value) << result.output;
    } else {
      EXPECT_EQ(got_token, want_token);
    }
  }
}

TEST(AtomicFileTest, UncommittedWriteLeavesTheOldFile) {
  testing::TempDir dir;
  write_file_atomically(dir.file("p"), "old");
  {
    AtomicFileWriter writer(dir.file("p"));
    writer.write("new content");
    // destroyed without commit: as if the process died mid-write
  }
  EXPECT_EQ(testing::read_file(dir.file("p")), "old");
  size_t files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    (void)entry;
    ++files;
  }
  EXPECT_EQ(files, 1u) << "the temporary file was left behind";
}

TEST(AtomicFileTest, FullDiskKeepsPreviousCheckpointAndSaysSo) {
  // A real full disk: a 256 KiB tmpfs (needs root, as CI has; skipped otherwise).
  testing::TempDir dir;
  if (testing::run_command({"mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", dir.path()}).exit_code != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs here (not root?)";
  }
  struct Unmount {
    std::string path;
    ~Unmount() { testing::run_command({"umount", "-l", path}); }
  } unmount{dir.path()};
  State small;
  small.tensors["w"] = torch::ones({1000});
  write_checkpoint_file(dir.file("model.ckpt"), small);
  State large;
  large.tensors["w"] = torch::ones({200000});  // 800 KB: does not fit
  try {
    write_checkpoint_file(dir.file("model.ckpt"), large);
    FAIL() << "writing 800 KB into a 256 KiB filesystem succeeded";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("disk is full"), std::string::npos) << error.what();
  }
  State kept = read_checkpoint_file(dir.file("model.ckpt"));
  EXPECT_TRUE(torch::equal(kept.tensors.at("w"), small.tensors.at("w")));
  size_t files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) files += entry.is_regular_file();
  EXPECT_EQ(files, 1u) << "a partial temporary file was left on the full disk";
}

}  // namespace
}  // namespace lockstep
