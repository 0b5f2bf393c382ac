// Generic access to the options of an optimizer's parameter groups.
//
// libtorch gives every optimizer type its own options struct (SGDOptions,
// AdamOptions, ...), but schedulers, the OptimWrapper and the logger only care
// about a few options that most optimizers share under different names. This
// header reads and writes them by name whatever the optimizer:
//
//   "lr"            every optimizer
//   "momentum"      SGD and RMSprop `momentum`; Adam and AdamW beta1 (`betas[0]`),
//                   as mmengine's momentum schedulers treat it
//   "weight_decay"  SGD, Adam, AdamW, RMSprop, Adagrad
//
//   double lr = lockstep::get_group_option(optimizer, 0, "lr");
//   lockstep::set_group_option(optimizer, 0, "momentum", 0.85);  // beta1 on Adam
//   // On LBFGS: throws "LBFGS has no option 'momentum' (its options: lr)".
//
// ParamGroupInfo names the parameters of each group, for messages and logs
// (build_optimizer_with_groups() fills it; see optimizer_builder.h).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <torch/optim/optimizer.h>

namespace lockstep {

// What lockstep knows about one param group of an optimizer it built; a vector
// of these runs parallel to optimizer.param_groups().
struct ParamGroupInfo {
  std::vector<std::string> param_names;  // parallel to the group's params()
  double lr_mult = 1.0;                  // group lr = configured lr * lr_mult
  double decay_mult = 1.0;               // group weight_decay = configured weight_decay * decay_mult
};

// "SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "LBFGS", or the demangled C++
// type name of any other optimizer.
std::string optimizer_type_name(const torch::optim::Optimizer& optimizer);

// True when parameter groups of this optimizer have `option` ("lr", "momentum",
// "weight_decay"). Decided from the type of the first group's options (or the
// defaults when there is no group).
bool has_group_option(const torch::optim::Optimizer& optimizer, const std::string& option);

// Reads / writes `option` of param group `group`. Throws lockstep::Error naming
// the optimizer type when it has no such option, and the group count when
// `group` is out of range.
double get_group_option(const torch::optim::Optimizer& optimizer, size_t group,
                        const std::string& option);
void set_group_option(torch::optim::Optimizer& optimizer, size_t group, const std::string& option,
                      double value);

// The same on one group; errors name the optimizer by its options type.
double get_group_option(const torch::optim::OptimizerParamGroup& group, const std::string& option);
void set_group_option(torch::optim::OptimizerParamGroup& group, const std::string& option,
                      double value);

// The option of every group, in group order.
std::vector<double> get_group_options(const torch::optim::Optimizer& optimizer,
                                      const std::string& option);

}  // namespace lockstep
