// EmptyCacheHook: returns the CUDA caching allocator's free blocks to the
// driver at chosen points (torch.cuda.empty_cache()), as mmengine's
// EmptyCacheHook: after each epoch and evaluation pass by default, before
// each epoch or after every iteration on request. Without CUDA it does nothing.
//
//   custom_hooks:
//     - {type: EmptyCacheHook, before_epoch: false, after_epoch: true, after_iter: false}
#pragma once

#include <map>
#include <string>

#include "lockstep/engine/hook.h"

namespace lockstep {

class EmptyCacheHook : public Hook {
 public:
  EmptyCacheHook(bool before_epoch, bool after_epoch, bool after_iter);
  void before_train_epoch() override;
  void after_train_epoch() override;
  void after_step() override;
  void after_val_epoch(const std::map<std::string, double>&) override;
  void after_test_epoch(const std::map<std::string, double>&) override;
  // How many times the cache was emptied (for tests).
  int64_t calls() const { return calls_; }

 private:
  void empty();
  bool before_epoch_, after_epoch_, after_iter_;
  int64_t calls_ = 0;
};

}  // namespace lockstep
