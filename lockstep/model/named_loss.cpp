#include "lockstep/model/named_loss.h"

#include "lockstep/core/error.h"

namespace lockstep {

bool is_named_loss(const std::string& name) {
  return name == "cross_entropy" || name == "mse" || name == "l1" || name == "bce_with_logits";
}

LossDict named_loss(const std::string& name, const torch::Tensor& output, const torch::Tensor& target,
                    const std::string& where) {
  namespace F = torch::nn::functional;
  LossDict losses;
  if (name == "cross_entropy") {
    losses.insert("loss_cls", F::cross_entropy(output, target));
  } else if (name == "bce_with_logits") {
    losses.insert("loss_cls", F::binary_cross_entropy_with_logits(output, target.to(output.scalar_type())));
  } else if (name == "mse") {
    losses.insert("loss_mse", F::mse_loss(output, target.to(output.scalar_type())));
  } else if (name == "l1") {
    losses.insert("loss_l1", F::l1_loss(output, target.to(output.scalar_type())));
  } else {
    LOCKSTEP_FAIL(where, ": loss must be cross_entropy, mse, l1 or bce_with_logits, got '", name, "'");
  }
  return losses;
}

}  // namespace lockstep
