// DataPreprocessor: turns a batch from the data loader into model input.
//
// It moves tensors to the model's device and, for images, converts to float and
// normalises per channel (mmengine's ImgDataPreprocessor). Models own one and
// call it at the start of their steps:
//
//   auto data = data_preprocessor()(batch, /*training=*/true);
//
// Config (under `model:`):
//   data_preprocessor: {type: ImgDataPreprocessor, mean: [72.94], std: [90.02], key: image}
//   memory_format: channels_last   # the inputs follow the model's (model/memory_format.h)
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

#include "lockstep/config/registry.h"
#include "lockstep/model/batch.h"

namespace lockstep {

class DataPreprocessor {
 public:
  virtual ~DataPreprocessor() = default;
  // transform(), then floating-point tensors cast to input_dtype() and
  // rewritten in input_memory_format() where each is set (and applies).
  Batch operator()(const Batch& batch, bool training) const;
  void set_device(const torch::Device& device) { device_ = device; }
  const torch::Device& device() const { return device_; }
  // The dtype floating-point inputs reach the model in. FSDP's mixed
  // precision sets it to param_dtype (PyTorch's cast_root_forward_inputs).
  void set_input_dtype(c10::optional<torch::Dtype> dtype) { input_dtype_ = dtype; }
  c10::optional<torch::Dtype> input_dtype() const { return input_dtype_; }
  // The memory format the model's floating-point inputs of its rank reach it
  // in: channels_last for a model made channels-last (`model.memory_format`).
  void set_input_memory_format(c10::optional<c10::MemoryFormat> format) { input_memory_format_ = format; }
  c10::optional<c10::MemoryFormat> input_memory_format() const { return input_memory_format_; }

 protected:
  // Moves every tensor to device(); subclasses add their own transforms.
  virtual Batch transform(const Batch& batch, bool training) const;

 private:
  torch::Device device_ = torch::kCPU;
  c10::optional<torch::Dtype> input_dtype_;
  c10::optional<c10::MemoryFormat> input_memory_format_;
};

// Normalises `key` to float: (x - mean[c]) / std[c] per channel (dimension 1).
class ImgDataPreprocessor : public DataPreprocessor {
 public:
  ImgDataPreprocessor(std::vector<double> mean, std::vector<double> std, std::string key = "image");

 protected:
  Batch transform(const Batch& batch, bool training) const override;

 private:
  std::string key_;
  std::vector<double> mean_;
  std::vector<double> std_;
  // mean_ and std_ on the device the last batch was on (float32).
  mutable torch::Tensor mean_on_device_;
  mutable torch::Tensor std_on_device_;
};

Registry<DataPreprocessor>& data_preprocessor_registry();

}  // namespace lockstep
