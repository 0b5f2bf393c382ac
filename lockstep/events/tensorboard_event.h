// The bytes of TensorBoard event files: Event protos holding Summary values
// (scalars, PNG images, histograms), each framed as a TFRecord.
//
// TensorBoardWriter uses these to write files; they are public so other
// writers (and tests) can build the same records. Field numbers follow
// TensorFlow's event.proto and summary.proto:
//   Event {double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5}
//   Summary {repeated Value value = 1}
//   Value {string tag = 1; float simple_value = 2; Image image = 4; HistogramProto histo = 5}
//   Image {int32 height = 1; int32 width = 2; int32 colorspace = 3; bytes encoded_image_string = 4}
//   HistogramProto {double min = 1, max = 2, num = 3, sum = 4, sum_squares = 5;
//                   repeated double bucket_limit = 6 [packed], bucket = 7 [packed]}
//
//   std::vector<std::string> values{lockstep::tensorboard::scalar_value("loss", 0.25)};
//   std::string record = lockstep::tensorboard::tfrecord(
//       lockstep::tensorboard::summary_event(wall_time, /*step=*/100, values));
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/types.h>

namespace lockstep::tensorboard {

// One encoded Summary.Value each.
std::string scalar_value(const std::string& tag, double value);
// `image`: what encode_png takes ([C, H, W], [H, W]), or a batch [N, C, H, W]
// that is tiled with image_grid first.
std::string image_value(const std::string& tag, const torch::Tensor& image);
// Non-finite values are left out (TensorFlow refuses them); returns "" when
// no finite value remains, and the caller writes nothing.
std::string histogram_value(const std::string& tag, const torch::Tensor& values);

// An encoded Event with a Summary of `values` (encoded Summary.Value messages).
std::string summary_event(double wall_time, int64_t step, const std::vector<std::string>& values);
// The first event of every file: file_version "brain.Event:2".
std::string file_version_event(double wall_time);

// TFRecord framing: uint64 length, masked CRC-32C of the length bytes, the
// data, masked CRC-32C of the data (all little-endian).
std::string tfrecord(const std::string& data);

// TensorFlow's default histogram buckets: limits growing by 10% from 1e-12
// to 1e20, mirrored for negatives, with 0 and +-DBL_MAX at the ends. A value
// v is counted in the first bucket whose limit is greater than v.
const std::vector<double>& default_histogram_bucket_limits();

}  // namespace lockstep::tensorboard
