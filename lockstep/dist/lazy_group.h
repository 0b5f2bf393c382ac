// A group of every rank of a parent group, built the first time it is used:
// a full mesh of Gloo connections costs each rank one socket (and on one host
// one port) per peer, so a group that a run may never use is not built up
// front (Note [Groups built when first used]).
//
//   LazyGroup side(world, "side");           // nothing connects yet
//   auto parts = all_gather_object(x, side.get());  // every rank's first get() builds it
//
// Every rank must make its first get() (as with new_group, the ranks meet in
// the store under the group's name); any thread may call it, and concurrent
// first calls on one rank build the group once.
#pragma once

#include <memory>
#include <mutex>
#include <string>

namespace lockstep {

class ProcessGroup;

class LazyGroup {
 public:
  LazyGroup(std::shared_ptr<ProcessGroup> parent, std::string name);
  std::shared_ptr<ProcessGroup> get();

 private:
  std::shared_ptr<ProcessGroup> parent_;
  std::string name_;
  std::mutex mutex_;
  std::shared_ptr<ProcessGroup> group_;
};

}  // namespace lockstep
