#include "lockstep/strategy/device_choice.h"

#include <cstdlib>
#include <optional>

#include "lockstep/compat/cuda.h"
#include "lockstep/core/error.h"

namespace lockstep {
namespace {

std::string visible_devices_note() {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  return visible != nullptr ? str_cat(" (CUDA_VISIBLE_DEVICES=", visible, ")") : std::string();
}

torch::Device cuda_device(int index, int cuda_devices, const std::string& where, const std::string& why) {
  LOCKSTEP_CHECK(index < cuda_devices, where, ": ", why, " needs GPU ", index, ", but this process sees ", cuda_devices,
                 " GPU(s)", visible_devices_note(),
                 ": start at most one process per GPU (e.g. --nproc-per-node ", cuda_devices, ") or use device: cpu");
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
}

}  // namespace

torch::Device choose_device(const std::string& requested, int local_rank, int cuda_devices, const std::string& where) {
  if (requested == "cpu") return torch::kCPU;
  const int rank_index = local_rank < 0 ? 0 : local_rank;
  if (requested == "auto") {
    return cuda_devices > 0 ? cuda_device(rank_index, cuda_devices, where, str_cat("LOCAL_RANK ", rank_index))
                            : torch::Device(torch::kCPU);
  }
  // "cuda" (the rank's GPU) or "cuda:N": parse first, then ask for GPUs once.
  std::optional<int> index;
  const std::string prefix = "cuda:";
  if (requested != "cuda") {
    const std::string digits = requested.compare(0, prefix.size(), prefix) == 0 ? requested.substr(prefix.size()) : "";
    char* end = nullptr;
    const long parsed = std::strtol(digits.c_str(), &end, 10);
    LOCKSTEP_CHECK(!digits.empty() && *end == '\0' && parsed >= 0 && parsed < 1024, where, ": '", requested,
                   "' is not a device (use auto, cpu, cuda or cuda:N)");
    index = static_cast<int>(parsed);
  }
  LOCKSTEP_CHECK(cuda_devices > 0, where, ": device '", requested, "' asked for, but ",
                 compat::built_with_cuda() ? "no GPU is visible" : "this libtorch was built without CUDA",
                 visible_devices_note(), "; use device: cpu or auto");
  return index ? cuda_device(*index, cuda_devices, where, str_cat("device '", requested, "'"))
               : cuda_device(rank_index, cuda_devices, where, str_cat("LOCAL_RANK ", rank_index));
}

torch::Device place_on_device(const std::string& requested, int local_rank, const std::string& where) {
  torch::Device device = choose_device(requested, local_rank, compat::cuda_device_count(), where);
  if (device.is_cuda()) compat::set_current_cuda_device(device.index());
  return device;
}

}  // namespace lockstep
