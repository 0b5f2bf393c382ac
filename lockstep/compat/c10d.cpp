#include "lockstep/compat/c10d.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cstdlib>
#include <sstream>

#include "lockstep/core/error.h"

namespace lockstep::compat {

std::string torch_version() {
  return str_cat(TORCH_VERSION_MAJOR, ".", TORCH_VERSION_MINOR, ".", TORCH_VERSION_PATCH);
}

std::pair<c10::intrusive_ptr<C10dStore>, int> make_tcp_store(const TcpStoreSpec& spec) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(spec.port);
  options.isServer = spec.is_server;
  options.numWorkers = static_cast<std::size_t>(spec.num_workers);
  // lockstep counts arrivals itself, so that a short world names who is missing.
  options.waitWorkers = false;
  options.timeout = spec.timeout;
  // Multi-tenancy caches servers by port, which would hand every port-0 request the same server.
  options.multiTenant = false;
#if TORCH_VERSION_MAJOR >= 2
  // Debian's 2.6 build has no libuv backend; the classic one behaves like 1.13's.
  options.useLibUV = false;
#endif
  auto store = c10::make_intrusive<c10d::TCPStore>(spec.host, options);
  int port = store->getPort();
  return {store, port};
}

int tcp_store_connections_per_client() {
#if TORCH_VERSION_MAJOR >= 2
  return 1;
#else
  return 2;
#endif
}

c10::intrusive_ptr<C10dStore> make_hash_store() { return c10::make_intrusive<c10d::HashStore>(); }

c10::intrusive_ptr<C10dStore> make_prefix_store(const std::string& prefix, c10::intrusive_ptr<C10dStore> store) {
  return c10::make_intrusive<c10d::PrefixStore>(prefix, std::move(store));
}

c10::intrusive_ptr<C10dStore> clone_store(const c10::intrusive_ptr<C10dStore>& store) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 7)
  return store->clone();
#else
  return store;
#endif
}

c10::intrusive_ptr<C10dGroup> make_gloo(const c10::intrusive_ptr<C10dStore>& store, int rank, int size,
                                        std::chrono::milliseconds timeout, const GlooDeviceSpec& device,
                                        int threads) {
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  if (!device.interfaces.empty()) {
    for (const auto& name : device.interfaces) {
      options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(name));
    }
  } else if (!device.host.empty()) {
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(device.host));
  } else {
    options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  }
  options->threads = threads;
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
}

// Note [Gloo's 16-bit types, asked]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// ProcessGroupGloo picks Gloo's element type from the tensor's dtype in
// ProcessGroupGloo.cpp, which no header shows. Debian's libtorch 2.14 (built
// against the system's Gloo) answers every float16, bfloat16 and int16 tensor
// with "Invalid scalar type": broadcast, all-gather and all-reduce alike,
// from Python too. 1.13 moves and reduces float16; 2.6 and pip's builds all
// three. Whether a build can is a fact about the build, not its version
// number, so lockstep asks it once: a broadcast of one float16 element in a
// one-rank Gloo group of its own (a HashStore, the loopback device; no
// socket leaves the process). Where the answer is no, process_group.cpp
// moves 16-bit tensors as bytes and reduces them in float32, rounding back
// once: for two ranks the same values as Gloo's float16 sum (one addition,
// rounded once), for more a sum rounded once instead of at each step.
// LOCKSTEP_GLOO_16_BIT_TYPES=0 takes that path on any build without asking:
// the tests run it on libtorch 1.13 (tests/comm/collectives_test.cpp), and a
// user whose Gloo mishandles 16-bit types has a way around it.
bool probe_16_bit_types() {
  const char* told = std::getenv("LOCKSTEP_GLOO_16_BIT_TYPES");
  if (told != nullptr && std::string(told) == "0") return false;
  try {
    auto options = c10d::ProcessGroupGloo::Options::create(std::chrono::milliseconds(10000));
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    options->threads = 1;
    auto group = c10::make_intrusive<c10d::ProcessGroupGloo>(c10::make_intrusive<c10d::HashStore>(), 0, 1, options);
    std::vector<at::Tensor> tensors{at::ones({1}, at::kHalf)};
    group->broadcast(tensors)->wait();
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

GlooCapabilities gloo_capabilities() {
  static const bool knows_16_bit_types = probe_16_bit_types();
#if TORCH_VERSION_MAJOR >= 2
  return GlooCapabilities{/*reduces_bfloat16=*/knows_16_bit_types, /*moves_bfloat16=*/knows_16_bit_types,
                          knows_16_bit_types,
                          /*reduce_scatter_base=*/true, /*reduce_scatter_base_max_min=*/false,
                          /*allgather_base=*/true, /*listens_per_pair=*/false};
#else
  return GlooCapabilities{/*reduces_bfloat16=*/false, /*moves_bfloat16=*/false, knows_16_bit_types,
                          /*reduce_scatter_base=*/false, /*reduce_scatter_base_max_min=*/false,
                          /*allgather_base=*/false, /*listens_per_pair=*/true};
#endif
}

namespace {

bool mentions_timeout(const std::string& message) {
  std::string lower = message;
  for (auto& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return lower.find("timed out") != std::string::npos || lower.find("timeout") != std::string::npos;
}

}  // namespace

bool wait_work(C10dWork& work, std::chrono::milliseconds timeout) {
  if (timeout.count() <= 0) {
    // kNoTimeout (0) means "forever" to c10d; lockstep never waits forever.
    if (!work.isCompleted()) return false;
    work.wait();
    return true;
  }
  try {
    work.wait(timeout);
    return true;
  } catch (const std::exception& error) {
    // c10d's own deadline ("Operation timed out!") leaves the work running;
    // Gloo's send/recv report theirs by failing the work. Both are timeouts.
    if (!work.isCompleted() || mentions_timeout(error.what())) return false;
    throw;
  }
}

}  // namespace lockstep::compat
