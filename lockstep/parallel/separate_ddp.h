// SeparateDistributedDataParallel: one DDP per network of a multi-network
// model (a GAN's generator and discriminator), as mmengine's
// MMSeparateDistributedDataParallel.
//
// Each child module with trainable parameters gets its own DDP (its own
// buckets, hooks and group); children without them are left alone. With an
// OptimWrapperDict each named wrapper synchronises only its own network, so
// the model's train_step can update the networks in turns; a single
// OptimWrapper drives all of them at once (this object is then its
// GradientSync, fanning out to every child).
//
//   auto separate = std::make_shared<lockstep::SeparateDistributedDataParallel>(gan, world());
//   separate->attach(*optim_wrappers);   // "generator" -> ddp of gan->generator, ...
#pragma once

#include <map>
#include <memory>
#include <string>

#include "lockstep/optim/gradient_sync.h"
#include "lockstep/optim/optim_wrapper.h"
#include "lockstep/parallel/ddp/distributed_data_parallel.h"

namespace lockstep {

class SeparateDistributedDataParallel : public GradientSync {
 public:
  SeparateDistributedDataParallel(std::shared_ptr<torch::nn::Module> module, std::shared_ptr<ProcessGroup> group,
                                  DDPOptions options = DDPOptions());

  // Gives every wrapper the DDP of the child it is named after; a single
  // OptimWrapper gets this object (all children).
  void attach(OptimWrapperBase& optim_wrapper);
  // The DDP of child `name`; an error listing the wrapped children if none.
  DistributedDataParallel& operator[](const std::string& name) const;
  const std::map<std::string, std::shared_ptr<DistributedDataParallel>>& children() const { return children_; }

  void begin_forward(bool sync) override;
  void begin_backward(const torch::Tensor& loss, bool sync, int64_t iteration) override;
  void end_backward(bool sync) override;
  // Each child's state under its name (a single OptimWrapper driving them all).
  State state() const override;
  void load_state(const State& state) override;

 private:
  std::map<std::string, std::shared_ptr<DistributedDataParallel>> children_;
};

}  // namespace lockstep
