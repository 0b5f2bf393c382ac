#include "lockstep/events/tensorboard_event.h"

#include <cfloat>
#include <cstring>

#include "lockstep/core/crc32c.h"
#include "lockstep/core/error.h"
#include "lockstep/core/png.h"
#include "lockstep/events/proto_encoder.h"

namespace lockstep::tensorboard {
namespace {

// Field numbers of TensorFlow's protos (see the header).
enum EventField { kWallTime = 1, kStep = 2, kFileVersion = 3, kSummary = 5 };
enum ValueField { kTag = 1, kSimpleValue = 2, kImage = 4, kHisto = 5 };
enum ImageField { kHeight = 1, kWidth = 2, kColorspace = 3, kEncodedImage = 4 };
enum HistoField { kMin = 1, kMax = 2, kNum = 3, kSum = 4, kSumSquares = 5, kBucketLimit = 6, kBucket = 7 };

void put_u32_le(std::string& out, uint32_t value) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

}  // namespace

std::string scalar_value(const std::string& tag, double value) {
  ProtoEncoder encoded;
  encoded.add_string(kTag, tag).add_float(kSimpleValue, static_cast<float>(value));
  return encoded.bytes();
}

std::string image_value(const std::string& tag, const torch::Tensor& image) {
  LOCKSTEP_CHECK(image.defined(), "TensorBoard image '", tag, "': the tensor is undefined");
  torch::Tensor chw = image.dim() == 4 ? image_grid(image) : image;
  if (chw.dim() == 2) chw = chw.unsqueeze(0);
  std::string png;
  try {
    png = encode_png(chw);
  } catch (const Error& error) {
    LOCKSTEP_FAIL("TensorBoard image '", tag, "': ", error.what());
  }
  ProtoEncoder picture;
  picture.add_int64(kHeight, chw.size(1)).add_int64(kWidth, chw.size(2)).add_int64(kColorspace, chw.size(0));
  picture.add_bytes(kEncodedImage, png);
  ProtoEncoder encoded;
  encoded.add_string(kTag, tag).add_message(kImage, picture);
  return encoded.bytes();
}

const std::vector<double>& default_histogram_bucket_limits() {
  static const std::vector<double> limits = [] {
    std::vector<double> positive;
    for (double v = 1.0e-12; v < 1.0e20; v *= 1.1) positive.push_back(v);
    positive.push_back(DBL_MAX);
    std::vector<double> all;
    all.reserve(2 * positive.size() + 1);
    for (auto it = positive.rbegin(); it != positive.rend(); ++it) all.push_back(-*it);
    all.push_back(0.0);
    all.insert(all.end(), positive.begin(), positive.end());
    return all;
  }();
  return limits;
}

std::string histogram_value(const std::string& tag, const torch::Tensor& values) {
  LOCKSTEP_CHECK(values.defined(), "TensorBoard histogram '", tag, "': the tensor is undefined");
  torch::Tensor flat = values.detach().to(torch::kCPU, torch::kDouble).flatten();
  flat = flat.masked_select(torch::isfinite(flat));
  if (flat.numel() == 0) return "";
  const std::vector<double>& limits = default_histogram_bucket_limits();
  torch::Tensor boundaries = torch::from_blob(const_cast<double*>(limits.data()),
                                              {static_cast<int64_t>(limits.size())}, torch::kDouble);
  // right=true: bucket i holds limits[i-1] <= v < limits[i], TensorFlow's upper_bound.
  // DBL_MAX itself would land past the last bucket; it belongs in it.
  torch::Tensor index = torch::bucketize(flat, boundaries, /*out_int32=*/false, /*right=*/true)
                            .clamp_max_(static_cast<int64_t>(limits.size()) - 1);
  torch::Tensor counts = torch::bincount(index, /*weights=*/{}, static_cast<int64_t>(limits.size()));
  const auto* count = counts.data_ptr<int64_t>();

  // TensorFlow's EncodeToProto: a run of empty buckets collapses into one
  // entry carrying the run's last limit.
  std::vector<double> bucket_limit;
  std::vector<double> bucket;
  for (size_t i = 0; i < limits.size();) {
    double end = limits[i];
    int64_t n = count[i];
    ++i;
    if (n <= 0) {
      while (i < limits.size() && count[i] <= 0) {
        end = limits[i];
        n = count[i];
        ++i;
      }
    }
    bucket_limit.push_back(end);
    bucket.push_back(static_cast<double>(n));
  }

  ProtoEncoder histo;
  histo.add_double(kMin, flat.min().item<double>())
      .add_double(kMax, flat.max().item<double>())
      .add_double(kNum, static_cast<double>(flat.numel()))
      .add_double(kSum, flat.sum().item<double>())
      .add_double(kSumSquares, flat.square().sum().item<double>())
      .add_packed_doubles(kBucketLimit, bucket_limit)
      .add_packed_doubles(kBucket, bucket);
  ProtoEncoder encoded;
  encoded.add_string(kTag, tag).add_message(kHisto, histo);
  return encoded.bytes();
}

std::string summary_event(double wall_time, int64_t step, const std::vector<std::string>& values) {
  ProtoEncoder summary;
  for (const auto& value : values) summary.add_bytes(1, value);
  ProtoEncoder event;
  event.add_double(kWallTime, wall_time).add_int64(kStep, step).add_message(kSummary, summary);
  return event.bytes();
}

std::string file_version_event(double wall_time) {
  ProtoEncoder event;
  event.add_double(kWallTime, wall_time).add_string(kFileVersion, "brain.Event:2");
  return event.bytes();
}

std::string tfrecord(const std::string& data) {
  std::string record;
  record.reserve(data.size() + 16);
  const uint64_t length = data.size();
  std::string length_bytes;
  put_u32_le(length_bytes, static_cast<uint32_t>(length & 0xffffffffu));
  put_u32_le(length_bytes, static_cast<uint32_t>(length >> 32));
  record += length_bytes;
  put_u32_le(record, mask_crc32c(crc32c(length_bytes.data(), length_bytes.size())));
  record += data;
  put_u32_le(record, mask_crc32c(crc32c(data.data(), data.size())));
  return record;
}

}  // namespace lockstep::tensorboard
