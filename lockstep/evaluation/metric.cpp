#include "lockstep/evaluation/metric.h"

#include <torch/torch.h>

#include "lockstep/core/error.h"

namespace lockstep {

Accuracy::Accuracy(std::vector<int64_t> topk, std::string logits_key, std::string label_key)
    : Metric("accuracy"), topk_(std::move(topk)), logits_key_(std::move(logits_key)), label_key_(std::move(label_key)) {
  LOCKSTEP_CHECK(!topk_.empty(), "Accuracy needs at least one k in topk");
  for (int64_t k : topk_) LOCKSTEP_CHECK(k >= 1, "Accuracy topk values must be at least 1, got ", k);
}

void Accuracy::process(const Batch& data, const Batch& predictions) {
  torch::Tensor logits = predictions.at(logits_key_).detach().to(torch::kCPU).to(torch::kFloat);
  torch::Tensor labels = data.at(label_key_).to(torch::kCPU).to(torch::kLong);
  LOCKSTEP_CHECK(logits.dim() == 2 && labels.dim() == 1 && logits.size(0) == labels.size(0), "Accuracy: '",
                 logits_key_, "' must be [N, classes] and '", label_key_, "' [N]; got ", logits.sizes(), " and ",
                 labels.sizes());
  const int64_t max_k = std::min<int64_t>(*std::max_element(topk_.begin(), topk_.end()), logits.size(1));
  torch::Tensor top = std::get<1>(logits.topk(max_k, /*dim=*/1));  // [N, max_k]
  torch::Tensor hits = top.eq(labels.unsqueeze(1));                 // [N, max_k]
  auto hits_a = hits.accessor<bool, 2>();
  for (int64_t i = 0; i < hits.size(0); ++i) {
    nlohmann::json record = nlohmann::json::array();
    for (int64_t k : topk_) {
      bool hit = false;
      for (int64_t j = 0; j < std::min(k, max_k); ++j) hit = hit || hits_a[i][j];
      record.push_back(hit ? 1 : 0);
    }
    add_result(std::move(record));
  }
}

std::map<std::string, double> Accuracy::compute(const std::vector<nlohmann::json>& results) const {
  std::map<std::string, double> metrics;
  for (size_t i = 0; i < topk_.size(); ++i) {
    double correct = 0;
    for (const auto& record : results) correct += record.at(i).get<double>();
    metrics["top" + std::to_string(topk_[i])] = results.empty() ? 0.0 : correct / static_cast<double>(results.size());
  }
  return metrics;
}

Evaluator::Evaluator(std::vector<std::shared_ptr<Metric>> metrics) : metrics_(std::move(metrics)) {
  LOCKSTEP_CHECK(!metrics_.empty(), "an Evaluator needs at least one metric");
}

void Evaluator::process(const Batch& data, const Batch& predictions) {
  for (auto& metric : metrics_) metric->process(data, predictions);
}

std::map<std::string, double> Evaluator::evaluate(int64_t dataset_size, const ResultCollector& collect) {
  std::map<std::string, double> all;
  for (auto& metric : metrics_) {
    std::vector<nlohmann::json> results;
    if (collect) {
      results = collect(metric->results(), dataset_size);
    } else {
      results = metric->results();
      if (static_cast<int64_t>(results.size()) > dataset_size) results.resize(static_cast<size_t>(dataset_size));
    }
    for (const auto& [name, value] : metric->compute(results)) all[metric->prefix() + "/" + name] = value;
    metric->reset();
  }
  return all;
}

Registry<Metric>& metric_registry() {
  static Registry<Metric> registry("metric");
  return registry;
}

std::shared_ptr<Evaluator> build_evaluator(const Config& config) {
  std::vector<std::shared_ptr<Metric>> metrics;
  if (config.is_sequence()) {
    for (size_t i = 0; i < config.size(); ++i) metrics.push_back(metric_registry().build(config.at(i)));
  } else {
    metrics.push_back(metric_registry().build(config));
  }
  return std::make_shared<Evaluator>(std::move(metrics));
}

LOCKSTEP_REGISTER(metric_registry(), "Accuracy", [](const Config& config) {
  return std::make_shared<Accuracy>(config.get<std::vector<int64_t>>("topk", {1}),
                                    config.get<std::string>("logits_key", "logits"),
                                    config.get<std::string>("label_key", "label"));
});

}  // namespace lockstep
