// The c10d seam: everything lockstep's distributed layer needs from libtorch's
// c10d that differs between libtorch 1.13 and 2.x, and nothing else.
//
// In 1.13 a backend such as Gloo *is* a c10d::ProcessGroup; in 2.x it is a
// c10d::Backend that a ProcessGroup dispatches to. lockstep talks to the
// backend object directly in both (no dispatcher, no Python-era ops), so the
// one alias `compat::C10dGroup` hides the difference. Gloo's gaps (no
// reduce_scatter / _allgather_base and no bfloat16 in 1.13) are published as
// constants so that lockstep/comm can pick an algorithm without `#if`.
//
//   auto [store, port] = lockstep::compat::make_tcp_store(
//       {"127.0.0.1", 0, /*is_server=*/true, /*num_workers=*/2, std::chrono::seconds(30)});
//   auto gloo = lockstep::compat::make_gloo(store, rank, 2, std::chrono::seconds(30));
//   std::vector<at::Tensor> tensors{t};
//   auto work = gloo->allreduce(tensors);
//   if (!lockstep::compat::wait_work(*work, std::chrono::seconds(5))) { /* still running */ }
#pragma once

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/version.h>
#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#endif

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace lockstep::compat {

// The object that runs collectives for one backend on one set of ranks.
#if TORCH_VERSION_MAJOR >= 2
using C10dGroup = c10d::Backend;
#else
using C10dGroup = c10d::ProcessGroup;
#endif
using C10dWork = c10d::Work;
using C10dStore = c10d::Store;

// libtorch's version, for messages and benchmark headers ("1.13.1").
std::string torch_version();

// --- stores ---------------------------------------------------------------

struct TcpStoreSpec {
  std::string host;
  int port = 0;                 // 0 with is_server: the OS picks a free port
  bool is_server = false;
  int num_workers = 1;          // informational: lockstep counts arrivals itself
  std::chrono::milliseconds timeout{30 * 60 * 1000};
};

// A TCPStore server or client. Returns the store and the port it listens on /
// connected to (the chosen one when spec.port == 0). A client retries
// connecting until spec.timeout. The server never waits for workers.
std::pair<c10::intrusive_ptr<C10dStore>, int> make_tcp_store(const TcpStoreSpec& spec);

// The connections one TCPStore client holds to its server: two in 1.13
// (a second one for watchKey callbacks), one in 2.x. A server holds as many
// per client (Note [Raising the open-file limit] in core/open_files.cpp).
int tcp_store_connections_per_client();

// An in-process store, for a world of one.
c10::intrusive_ptr<C10dStore> make_hash_store();

c10::intrusive_ptr<C10dStore> make_prefix_store(const std::string& prefix,
                                                 c10::intrusive_ptr<C10dStore> store);

// A c10d store that lockstep writes derives from this, not from c10d::Store.
// PyTorch 2.7 gave c10d::Store a pure virtual clone() (a store over its own
// connection, for another thread); 1.13 and 2.6 have none. A subclass writes
// clone_store() and this base makes it the clone() where libtorch has one.
class StoreBase : public C10dStore {
 public:
  using C10dStore::C10dStore;
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 7)
  c10::intrusive_ptr<C10dStore> clone() override { return clone_store(); }
#endif

 protected:
  virtual c10::intrusive_ptr<C10dStore> clone_store() = 0;
};

// `store` over a connection of its own where libtorch can make one (2.7 and
// later: Store::clone()); before that, `store` itself, shared.
c10::intrusive_ptr<C10dStore> clone_store(const c10::intrusive_ptr<C10dStore>& store);

// --- backends ---------------------------------------------------------------

// Where a Gloo device binds: named interfaces, else an address, else (both
// empty) Gloo's default, the host name's address. comm/network.h decides.
struct GlooDeviceSpec {
  std::vector<std::string> interfaces;
  std::string host;
};

// A Gloo backend over `store`.
c10::intrusive_ptr<C10dGroup> make_gloo(const c10::intrusive_ptr<C10dStore>& store, int rank, int size,
                                        std::chrono::milliseconds timeout, const GlooDeviceSpec& device = {},
                                        int threads = 2);

// Whether this libtorch was built with NCCL (decided at compile time).
bool has_nccl();

// Whether `group` is an NCCL backend (which moves device memory itself).
bool is_nccl(const C10dGroup& group);

// An NCCL backend whose waits are bounded by `timeout` like Gloo's (see
// nccl_wait_settings); throws lockstep::Error when has_nccl() is false.
c10::intrusive_ptr<C10dGroup> make_nccl(const c10::intrusive_ptr<C10dStore>& store, int rank, int size,
                                        std::chrono::milliseconds timeout);

// How an NCCL group is set up so that no wait outlives the group timeout.
//
// lockstep waits on every collective with the group timeout (Work::wait), and
// on NCCL that wait must block the host, not only the compute stream:
// libtorch 2.6 does so whenever wait() is given a timeout (its
// ProcessGroupNCCL.hpp says so); older versions only with NCCL_BLOCKING_WAIT=1,
// which is therefore set there unless the user set it. Either
// way, a wait that runs out aborts the group's NCCL communicators (libtorch
// does it before it throws), so the kernels of this rank stop and the
// launcher can restart the job; lockstep then names the late ranks from the
// arrival board. libtorch's watchdog gets a longer timeout, as a backstop for
// work nobody waits on (it tears the process down), so that lockstep's
// message comes first.
struct NcclWaitSettings {
  std::chrono::milliseconds watchdog_timeout{0};
  std::vector<std::pair<std::string, std::string>> env_defaults;  // set where the user has not
  std::vector<std::string> warnings;                              // user settings that unbound waits
};
NcclWaitSettings nccl_wait_settings(std::chrono::milliseconds group_timeout, int torch_major, int torch_minor,
                                    const std::function<const char*(const char*)>& getenv);

// What Gloo can do natively in this libtorch.
struct GlooCapabilities {
  bool reduces_bfloat16;      // all_reduce / reduce on bfloat16 tensors
  bool moves_bfloat16;        // broadcast / allgather / gather of bfloat16 tensors
  // float16 (and int16), reduced and moved: every libtorch but Debian's 2.14,
  // whose ProcessGroupGloo knows no 16-bit type at all (Note [Gloo's 16-bit
  // types, asked]).
  bool knows_16_bit_types;
  bool reduce_scatter_base;   // _reduce_scatter_base (reduce_scatter_tensor) with SUM
  // 2.6's Gloo _reduce_scatter_base sums whatever op it is given (MAX and
  // MIN come back as sums), so only SUM may use it.
  bool reduce_scatter_base_max_min;
  bool allgather_base;        // _allgather_base (all_gather_into_tensor)
  // 1.13's Gloo (Debian's 2022-05 snapshot) binds a listening port for each
  // pair while a mesh connects; 2.x's listens on one port per process.
  bool listens_per_pair;
};
GlooCapabilities gloo_capabilities();

// --- work -------------------------------------------------------------------

// Waits for `work` up to `timeout`. Returns true when it finished, false when
// the time ran out first; rethrows the work's own failure. Note that Gloo's
// send/recv works can only be waited on once: after a false return they are
// finished (with a timeout error) and must not be waited on again.
bool wait_work(C10dWork& work, std::chrono::milliseconds timeout);

}  // namespace lockstep::compat
