// Views of the job's c10d store that a group's setup goes through.
//
// - make_polling_store: waits that never hold the connection, so that two
//   threads of a process can build groups at once over one TCPStore client
//   (Note [Waiting without holding the store]).
// - make_address_table_store: Gloo's key exchange in a constant number of
//   store operations on every rank but rank 0 (Note [One table of Gloo
//   addresses]).
// - make_counting_store: counts the operations made through it, for the
//   per-rank figure init_process_group logs ("N store operations").
//
//   auto counted = lockstep::make_counting_store(tcp_store);
//   auto exchange = lockstep::make_polling_store(compat::make_prefix_store("gloo/", counted.store), timeout,
//                                                "group 'side'");
//   auto gloo = lockstep::make_gloo_mesh(exchange, rank, size, timeout, device);  // through the address table
//   logger().info("{} store operations, {} bytes read", counted.operations->load(), counted.bytes_read->load());
//
// Everything a view does not change goes straight to the wrapped store.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include <c10/macros/Macros.h>

#include "lockstep/compat/c10d.h"

namespace lockstep {

// `timeout` bounds a wait that names none; `where` names the store in the
// error a timed-out wait throws ("... waiting in group 'metrics' for keys [1]").
c10::intrusive_ptr<compat::C10dStore> make_polling_store(c10::intrusive_ptr<compat::C10dStore> store,
                                                         std::chrono::milliseconds timeout, std::string where);

// The store a Gloo backend of `size` ranks is built over, this process being
// `rank`: each family of per-rank keys Gloo sets and reads ("0/3",
// "0/rank_3") travels as one table that rank 0 publishes.
c10::intrusive_ptr<compat::C10dStore> make_address_table_store(c10::intrusive_ptr<compat::C10dStore> store, int rank,
                                                               int size, std::chrono::milliseconds timeout);

// A Gloo backend of `size` ranks whose key exchange goes through the address
// table over `exchange`: how the world group and new_group build a mesh.
c10::intrusive_ptr<compat::C10dGroup> make_gloo_mesh(c10::intrusive_ptr<compat::C10dStore> exchange, int rank,
                                                     int size, std::chrono::milliseconds timeout,
                                                     const compat::GlooDeviceSpec& device);

// While one lives on a thread, the groups that thread builds wait on the store
// in one blocking call instead of polling. init_process_group opens one: no
// other thread of the process uses the store before the world exists, so the
// world's node groups cost each rank a constant number of operations.
class BlockingStoreWaits {
 public:
  BlockingStoreWaits();
  ~BlockingStoreWaits();
  C10_DISABLE_COPY_AND_ASSIGN(BlockingStoreWaits);
  static bool active();  // on the calling thread

 private:
  bool previous_;
};

// `store`, counting every call made through it (set, get, wait, check, add,
// compareSet, deleteKey, getNumKeys: one each) in `operations`, and the bytes
// its gets returned in `bytes_read`, both shared by clones.
struct CountedStore {
  c10::intrusive_ptr<compat::C10dStore> store;
  std::shared_ptr<std::atomic<int64_t>> operations;
  std::shared_ptr<std::atomic<int64_t>> bytes_read;
};
CountedStore make_counting_store(c10::intrusive_ptr<compat::C10dStore> store);

}  // namespace lockstep
