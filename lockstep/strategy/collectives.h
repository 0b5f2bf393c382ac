// Collectives: what hooks, the runner and the C API need from the ranks of a
// run: who this rank is, and the few agreements between ranks that are not a
// model's gradients (a seed, a stop vote, a checkpoint phase that every rank
// must pass, evaluation records, step metrics).
//
// A Strategy hands out its Collectives (Strategy::collectives()); code that
// only needs the ranks depends on this header, not on strategy.h. The base
// class is a world of one process: every call returns at once with the local
// answer. GroupCollectives runs them over a process group.
//
//   std::shared_ptr<lockstep::Collectives> ranks = strategy->collectives();
//   if (ranks->any_rank(local_wants_to_stop)) { ... }    // every rank, the same answer
//   ranks->agree("saving " + path, [&] { write(path); }); // throws on every rank if one failed
//   uint64_t seed = ranks->broadcast_seed(std::random_device{}());
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "lockstep/core/step_metrics.h"

namespace lockstep {

class ProcessGroup;

// A world of one process: nothing to exchange.
class Collectives {
 public:
  virtual ~Collectives();

  virtual int rank() const { return 0; }
  virtual int world_size() const { return 1; }
  bool is_main_process() const { return rank() == 0; }

  // Waits for every rank.
  virtual void barrier() {}
  // Rank 0's value, on every rank (seeds drawn at random must agree).
  virtual uint64_t broadcast_seed(uint64_t seed) { return seed; }
  // Rank 0's `value`, on every rank (the others' argument is ignored).
  virtual nlohmann::json broadcast_from_main(const nlohmann::json& value) { return value; }
  // Whether `local` is true on any rank (one tiny all-reduce).
  virtual bool any_rank(bool local) { return local; }
  // Whether every rank passed the same `value` (one tiny all-reduce).
  virtual bool same_on_every_rank(int64_t value) { return true; }
  // Every rank's `value`, in rank order.
  virtual std::vector<nlohmann::json> all_gather_json(const nlohmann::json& value) { return {value}; }
  // Runs `body` on this rank, then agrees with every rank on whether all of
  // theirs succeeded (comm/agreement.h, Note [Failing together]): when any
  // threw, every rank throws the same error naming the first failing rank.
  virtual void agree(const std::string& phase, const std::function<void()>& body) { body(); }

  // In-place collectives on tensors over every rank, for hooks: `average`
  // makes a tensor the mean of every rank's, `broadcast` copies the main
  // process's into it. Both null for one process.
  struct TensorCollectives {
    std::function<void(torch::Tensor&)> average;
    std::function<void(torch::Tensor&)> broadcast;
  };
  virtual TensorCollectives tensor_collectives() { return {}; }
  // How the trainer gathers step metrics across ranks. May be called from
  // the asynchronous metrics writer's thread.
  virtual MetricsGatherer metrics_gatherer();
  // Gathers evaluation records from every rank into dataset order (see
  // Evaluator), cut at `dataset_size` (a sampler pads the last shards).
  virtual std::vector<nlohmann::json> collect_results(const std::vector<nlohmann::json>& local,
                                                      int64_t dataset_size);
};

// The collectives of the processes in `world`, on its connections (Note [One
// mesh per process]). Every call is collective: each rank makes it at the
// same point.
class GroupCollectives final : public Collectives {
 public:
  explicit GroupCollectives(std::shared_ptr<ProcessGroup> world);

  int rank() const override;
  int world_size() const override;
  void barrier() override;
  uint64_t broadcast_seed(uint64_t seed) override;
  nlohmann::json broadcast_from_main(const nlohmann::json& value) override;
  bool any_rank(bool local) override;
  bool same_on_every_rank(int64_t value) override;
  std::vector<nlohmann::json> all_gather_json(const nlohmann::json& value) override;
  void agree(const std::string& phase, const std::function<void()>& body) override;
  TensorCollectives tensor_collectives() override;
  MetricsGatherer metrics_gatherer() override;
  std::vector<nlohmann::json> collect_results(const std::vector<nlohmann::json>& local,
                                              int64_t dataset_size) override;

 private:
  std::shared_ptr<ProcessGroup> world_;
  // Note [A group per thread of collectives]: collectives of one group must be
  // issued in the same order on every rank, which only one thread per rank can
  // promise. The trainer's asynchronous metrics writer gathers from its own
  // thread while the main thread evaluates, so metrics go over a side channel
  // of the world group; evaluation records over a view of it, from the main
  // thread. Neither builds connections (Note [One mesh per process]).
  std::shared_ptr<ProcessGroup> metrics_group_;  // step metrics, from the metrics writer's thread
  std::shared_ptr<ProcessGroup> side_group_;     // evaluation records, from the main thread
};

}  // namespace lockstep
