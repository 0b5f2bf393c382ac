// Batch: a named, ordered collection of tensors that share a batch dimension.
//
// Datasets produce them, data preprocessors transform them, models consume
// them. There is no type sniffing: a model asks for the names it needs.
//
//   lockstep::Batch batch{{"image", images}, {"label", labels}};
//   batch.set("weight", weights);
//   auto x = batch.at("image");        // error lists the names present if absent
//   auto on_gpu = batch.pin_memory().to(torch::kCUDA, /*non_blocking=*/true);
#pragma once

#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include <torch/types.h>

namespace lockstep {

class Batch {
 public:
  Batch() = default;
  Batch(std::initializer_list<std::pair<std::string, torch::Tensor>> items);

  // Adds or replaces.
  void set(const std::string& name, torch::Tensor tensor);
  const torch::Tensor& at(const std::string& name) const;
  bool contains(const std::string& name) const;
  std::vector<std::string> names() const;
  bool empty() const { return items_.empty(); }

  // The size of dimension 0 of the first tensor (0 when empty).
  int64_t size() const;
  Batch to(const torch::Device& device, bool non_blocking = false) const;
  // The same tensors in page-locked host memory (CPU tensors only; already
  // pinned ones are kept), so that to(cuda, non_blocking) is asynchronous.
  // Needs a CUDA build with a visible GPU (compat::can_pin_memory()).
  Batch pin_memory() const;
  // Rows [start, start + length) of every tensor (micro-batching, tests).
  Batch slice(int64_t start, int64_t length) const;
  // Concatenates batches along dimension 0 (same names in each).
  static Batch concat(const std::vector<Batch>& batches);

  // Every floating-point tensor cast to `dtype` (cast_floating below).
  Batch cast_floating(c10::optional<torch::Dtype> dtype) const;

  using Items = std::vector<std::pair<std::string, torch::Tensor>>;
  Items::const_iterator begin() const { return items_.begin(); }
  Items::const_iterator end() const { return items_.end(); }

 private:
  Items items_;
};

// PyTorch's _cast_fp_tensor: `tensor` as `dtype` when `dtype` is set and
// `tensor` is floating-point of another dtype; otherwise `tensor` itself.
// (mixed precision's input and output casts).
torch::Tensor cast_floating(const torch::Tensor& tensor, c10::optional<torch::Dtype> dtype);

}  // namespace lockstep
