#include "lockstep/strategy/device_choice.h"

#include <cstdlib>
#include <optional>

#include "lockstep/compat/cuda.h"
#include "lockstep/core/error.h"
#include "lockstep/core/logging.h"

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

int rank_index(LocalPlace place) { return place.rank < 0 ? 0 : place.rank; }

// Note [auto never fails for want of GPUs]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// `device: auto` is the default, so it must train wherever it is started: a
// 2-process demo on a one-GPU workstation included. A rank's GPU is its own or
// none (NCCL runs one rank per GPU; a shared GPU is an explicit choice, cuda:N
// over Gloo), and every rank of a machine must decide alike, or some would
// choose NCCL and the others Gloo. So the test is the machine's: a GPU for
// each of LOCAL_WORLD_SIZE ranks, or all of them on the CPU. Where the
// launcher does not say how many ranks share the machine, the rank's own index
// decides, and a rank past the GPUs is an error as before, since its
// neighbours may have chosen their GPUs.
bool enough_gpus(LocalPlace place, int cuda_devices) {
  if (place.size < 0) return true;  // unknown: cuda_device() checks this rank's own index
  return std::max(place.size, rank_index(place) + 1) <= cuda_devices;
}

}  // namespace

torch::Device choose_device(const std::string& requested, LocalPlace place, int cuda_devices, const std::string& where) {
  if (requested == "cpu") return torch::kCPU;
  if (requested == "auto") {
    if (cuda_devices == 0 || !enough_gpus(place, cuda_devices)) return torch::kCPU;
    return cuda_device(rank_index(place), cuda_devices, where, str_cat("LOCAL_RANK ", rank_index(place)));
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
               : cuda_device(rank_index(place), cuda_devices, where, str_cat("LOCAL_RANK ", rank_index(place)));
}

std::string auto_device_fallback(const std::string& requested, LocalPlace place, int cuda_devices) {
  if (requested != "auto" || cuda_devices == 0 || enough_gpus(place, cuda_devices)) return "";
  const int ranks = std::max(place.size, rank_index(place) + 1);
  return str_cat("device auto: ", ranks, " processes on this machine and ", cuda_devices, " GPU(s)",
                 visible_devices_note(), ", so every rank runs on the CPU (NCCL takes one GPU per rank); start ",
                 cuda_devices == 1 ? "1 process" : str_cat("at most ", cuda_devices, " processes"),
                 " per machine to train on the GPUs, or set strategy.device: cpu to choose the CPU and silence this");
}

torch::Device place_on_device(const std::string& requested, LocalPlace place, const std::string& where) {
  const int cuda_devices = compat::cuda_device_count();
  torch::Device device = choose_device(requested, place, cuda_devices, where);
  if (rank_index(place) == 0) {
    if (std::string why = auto_device_fallback(requested, place, cuda_devices); !why.empty()) logger().warn("{}", why);
  }
  if (device.is_cuda()) compat::set_current_cuda_device(device.index());
  return device;
}

}  // namespace lockstep
