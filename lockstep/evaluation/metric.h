// Metric and Evaluator: turn predictions into named numbers.
//
// A Metric keeps one small JSON record per sample (mmengine's BaseMetric
// results). Across ranks, records are gathered in dataset order and cut to
// the dataset's size, so samples a distributed sampler repeated to even out
// the shards are counted once. Then compute() reduces them to metrics.
//
//   lockstep::Evaluator evaluator({std::make_shared<lockstep::Accuracy>(std::vector<int64_t>{1, 5})});
//   for each batch: evaluator.process(batch, model.val_step(batch));
//   auto metrics = evaluator.evaluate(dataset_size);   // {"accuracy/top1": 0.91, "accuracy/top5": 0.998}
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lockstep/config/registry.h"
#include "lockstep/model/batch.h"

namespace lockstep {

class Metric {
 public:
  explicit Metric(std::string prefix) : prefix_(std::move(prefix)) {}
  virtual ~Metric() = default;

  // Consumes one batch: the data given to val_step and what it predicted.
  virtual void process(const Batch& data, const Batch& predictions) = 0;
  // Reduces every sample's record (dataset order) to metrics named without prefix.
  virtual std::map<std::string, double> compute(const std::vector<nlohmann::json>& results) const = 0;

  const std::vector<nlohmann::json>& results() const { return results_; }
  void reset() { results_.clear(); }
  const std::string& prefix() const { return prefix_; }

 protected:
  void add_result(nlohmann::json record) { results_.push_back(std::move(record)); }

 private:
  std::string prefix_;
  std::vector<nlohmann::json> results_;
};

// Top-k classification accuracy: predictions["logits"] against data["label"].
class Accuracy : public Metric {
 public:
  explicit Accuracy(std::vector<int64_t> topk = {1}, std::string logits_key = "logits",
                    std::string label_key = "label");
  void process(const Batch& data, const Batch& predictions) override;
  std::map<std::string, double> compute(const std::vector<nlohmann::json>& results) const override;

 private:
  std::vector<int64_t> topk_;
  std::string logits_key_;
  std::string label_key_;
};

// Gathers one rank's records from every rank into dataset order, cut to
// `dataset_size`. The default (one process) only cuts.
using ResultCollector =
    std::function<std::vector<nlohmann::json>(const std::vector<nlohmann::json>& local, int64_t dataset_size)>;

class Evaluator {
 public:
  explicit Evaluator(std::vector<std::shared_ptr<Metric>> metrics);
  void process(const Batch& data, const Batch& predictions);
  // Metrics named "<prefix>/<name>"; resets the metrics for the next pass.
  std::map<std::string, double> evaluate(int64_t dataset_size, const ResultCollector& collect = nullptr);
  const std::vector<std::shared_ptr<Metric>>& metrics() const { return metrics_; }

 private:
  std::vector<std::shared_ptr<Metric>> metrics_;
};

Registry<Metric>& metric_registry();
// `val_evaluator:` as one metric map or a list of them.
std::shared_ptr<Evaluator> build_evaluator(const Config& config);

}  // namespace lockstep
