#include "apps/lockstep/ckpt_command.h"

#include <algorithm>
#include <iomanip>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "lockstep/checkpoint/checkpoint_file.h"
#include "lockstep/checkpoint/pretrained.h"
#include "lockstep/checkpoint/sharded_checkpoint.h"
#include "lockstep/checkpoint/checkpoint_layout.h"
#include "lockstep/checkpoint/pt_file.h"
#include "lockstep/checkpoint/safetensors_tools.h"
#include "lockstep/core/error.h"
#include "lockstep/core/state.h"
#include "lockstep/builtin_models/torchscript_model.h"
#include "lockstep/strategy/strategy.h"

namespace lockstep::cli {
namespace {

struct InspectArguments {
  std::string file;
  bool json = false;
  bool no_config = false;
};

struct ExportArguments {
  std::string file;
  std::string format = "safetensors";
  std::string out;
  std::string dtype = "keep";
  bool ema = false;
};

std::string human_bytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  std::ostringstream text;
  text << std::setprecision(unit == 0 ? 0 : 2) << std::fixed << value << " " << units[unit];
  return text.str();
}

// The trained TorchScriptModel of a checkpoint, as torch.jit.save writes it:
// the run's config (kept in the checkpoint) names the scripted module, whose
// weights are replaced by the checkpoint's (strictly) before saving.
size_t export_torchscript(const std::string& checkpoint, const std::string& out) {
  CheckpointContents contents = read_checkpoint(checkpoint);
  LOCKSTEP_CHECK(contents.meta && !contents.meta->config.empty(), checkpoint,
                 ": --format torchscript needs the run's config, and this checkpoint has none");
  Config config = parse_config(contents.meta->config, checkpoint + " (the run's config)");
  const Config model_config = config.at("model");
  LOCKSTEP_CHECK(model_config.get<std::string>("type", "") == "TorchScriptModel", checkpoint,
                 ": --format torchscript exports a TorchScriptModel; this run trained a ",
                 model_config.get<std::string>("type", "?"), " (export its weights as safetensors or pt)");
  auto model = std::dynamic_pointer_cast<TorchScriptModel>(build_model(model_config));
  LOCKSTEP_CHECK(model != nullptr, checkpoint, ": the run's model did not build as a TorchScriptModel");
  SingleDeviceStrategy strategy(torch::kCPU);
  strategy.prepare(model, Config(), Config(), SchedulerContext{});
  const auto weights = whole_model_weights(contents, checkpoint);
  strategy.load_model_state_dict(weights, /*strict=*/true, checkpoint);
  model->eval();
  model->save_torchscript(out);
  return weights.size();
}

// A PyTorch .pt file: the state dict lockstep would load from it.
nlohmann::json describe_pt_file(const std::string& path) {
  nlohmann::json tensors = nlohmann::json::array();
  uint64_t total = 0;
  for (const auto& [name, tensor] : read_pt_state_dict(path)) {
    const uint64_t bytes = static_cast<uint64_t>(tensor.numel()) * tensor.element_size();
    total += bytes;
    tensors.push_back({{"name", name}, {"dtype", c10::toString(tensor.scalar_type())}, {"shape", tensor.sizes().vec()},
                       {"bytes", bytes}});
  }
  return {{"file", path}, {"kind", "PyTorch state dict (torch.save)"}, {"tensors", tensors}, {"bytes", total}};
}

// Everything inspect shows, as JSON (the --json output; the text form is rendered from it).
nlohmann::json describe_file(const std::string& path) {
  if (is_torch_save_file(path)) return describe_pt_file(path);
  nlohmann::json header = read_safetensors_header(path);
  nlohmann::json info = {{"file", path}};
  nlohmann::json tensors = nlohmann::json::array();
  uint64_t total = 0;
  for (const auto& item : header.items()) {
    if (item.key() == "__metadata__") continue;
    const auto& entry = item.value();
    uint64_t bytes = entry.at("data_offsets").at(1).get<uint64_t>() - entry.at("data_offsets").at(0).get<uint64_t>();
    total += bytes;
    tensors.push_back({{"name", item.key()}, {"dtype", entry.at("dtype")}, {"shape", entry.at("shape")}, {"bytes", bytes}});
  }
  if (is_lockstep_checkpoint(header)) {
    // Reading it whole verifies every checksum; a fault is an error naming the file and the tensor.
    State state = read_checkpoint_file(path);
    info["kind"] = "lockstep checkpoint";
    info["verified"] = true;
    const std::optional<RunMeta> meta = contents_of(state).meta;
    info["iteration"] = meta ? nlohmann::json(meta->iteration) : nlohmann::json();
    info["config"] = meta ? nlohmann::json(meta->config) : nlohmann::json();
    info["meta"] = nlohmann::json::object();
    if (meta) info["meta"] = {{"seed", meta->seed}, {"world_size", meta->world_size}, {"strategy", meta->strategy}};
    info["parts"] = checkpoint_parts(state);  // part -> tensor count
  } else {
    read_safetensors_file(path);  // validates every entry and the data's extent
    info["kind"] = "safetensors";
    info["metadata"] = header.value("__metadata__", nlohmann::json::object());
  }
  info["tensors"] = tensors;
  info["bytes"] = total;
  return info;
}

// "key: value", or a multi-line value (a config's YAML) as an indented block under "key:".
void print_value(const std::string& key, const std::string& value, const std::string& indent, std::ostream& out) {
  if (value.find('\n') == std::string::npos) {
    out << indent << key << ": " << value << "\n";
    return;
  }
  out << indent << key << ":\n";
  std::istringstream lines(value);
  std::string line;
  while (std::getline(lines, line)) out << indent << "  " << line << "\n";
}

void print_text(const nlohmann::json& info, bool with_config, std::ostream& out) {
  out << info["file"].get<std::string>() << ": " << info["kind"].get<std::string>();
  if (info.value("verified", false)) out << ", checksums verified";
  out << "\n";
  if (info.contains("iteration")) {
    out << "iteration: " << (info["iteration"].is_null() ? "unknown" : info["iteration"].dump()) << "\n";
    const auto& meta = info["meta"];
    for (const auto& item : meta.items()) {
      if (item.key() == "iteration") continue;
      out << item.key() << ": " << (item.value().is_string() ? item.value().get<std::string>() : item.value().dump())
          << "\n";
    }
    out << "holds: ";
    bool first = true;
    for (const auto& item : info["parts"].items()) {
      out << (first ? "" : ", ") << item.key();
      const int count = item.value().get<int>();
      if (count > 0) out << " (" << count << (count == 1 ? " tensor)" : " tensors)");
      first = false;
    }
    out << "\n";
  }
  if (info.contains("metadata") && !info["metadata"].empty()) {
    out << "metadata:\n";
    for (const auto& item : info["metadata"].items()) print_value(item.key(), item.value().get<std::string>(), "  ", out);
  }
  const auto& tensors = info["tensors"];
  size_t name_width = 0;
  for (const auto& tensor : tensors) name_width = std::max(name_width, tensor["name"].get<std::string>().size());
  out << "tensors (" << tensors.size() << ", " << human_bytes(info["bytes"].get<uint64_t>()) << "):\n";
  for (const auto& tensor : tensors) {
    std::string shape = "[";
    for (size_t i = 0; i < tensor["shape"].size(); ++i) shape += (i ? ", " : "") + tensor["shape"][i].dump();
    shape += "]";
    out << "  " << std::left << std::setw(static_cast<int>(name_width)) << tensor["name"].get<std::string>() << "  "
        << std::setw(5) << tensor["dtype"].get<std::string>() << " " << shape << "\n";
  }
  if (with_config && info.contains("config") && info["config"].is_string()) {
    print_value("config", info["config"].get<std::string>(), "", out);
  }
}

std::optional<c10::ScalarType> parse_export_dtype(const std::string& name) {
  if (name == "keep") return std::nullopt;
  if (name == "float32") return torch::kFloat32;
  if (name == "float16") return torch::kFloat16;
  if (name == "bfloat16") return torch::kBFloat16;
  LOCKSTEP_FAIL("unknown --dtype ", name);
}

struct DiffArguments {
  std::string first, second;
  double atol = 0;
};

// Compares the model weights of two checkpoints tensor by tensor (lockstep
// checkpoints, full or sharded, or any weights file load_from reads); prints
// what differs and returns whether all is within `atol` (0: bitwise).
bool diff_model_weights(const DiffArguments& args, std::ostream& out) {
  const auto first = read_model_weights(args.first);
  const auto second = read_model_weights(args.second);
  size_t differing = 0;
  double worst = 0;
  for (const auto& [name, tensor] : first) {
    auto other = second.find(name);
    if (other == second.end()) {
      out << name << ": only in " << args.first << "\n";
      ++differing;
      continue;
    }
    if (tensor.sizes() != other->second.sizes() || tensor.scalar_type() != other->second.scalar_type()) {
      out << name << ": " << tensor.toString() << tensor.sizes() << " vs " << other->second.toString()
          << other->second.sizes() << "\n";
      ++differing;
      continue;
    }
    if (torch::equal(tensor, other->second)) continue;
    const double diff = (tensor.to(torch::kDouble) - other->second.to(torch::kDouble)).abs().max().item<double>();
    worst = std::max(worst, diff);
    if (diff > args.atol) {
      out << name << ": max |difference| " << diff << "\n";
      ++differing;
    }
  }
  for (const auto& entry : second) {
    if (first.count(entry.first) == 0) {
      out << entry.first << ": only in " << args.second << "\n";
      ++differing;
    }
  }
  out << first.size() << " tensors compared: "
      << (differing == 0 ? (worst == 0 ? std::string("bitwise equal")
                                       : "equal within atol " + std::to_string(args.atol) + " (largest difference " +
                                             std::to_string(worst) + ")")
                         : std::to_string(differing) + " differ")
      << std::endl;
  return differing == 0;
}

}  // namespace

CLI::App* add_ckpt_command(CLI::App& app) {
  CLI::App* ckpt = app.add_subcommand(
      "ckpt", "Inspect, export and compare checkpoints (lockstep ckpt inspect|export|diff)");
  ckpt->require_subcommand(1);

  auto inspect_args = std::make_shared<InspectArguments>();
  CLI::App* inspect = ckpt->add_subcommand(
      "inspect",
      "Show a checkpoint's iteration, tensors (name, dtype, shape) and config; any safetensors or PyTorch .pt file works");
  inspect->add_option("file", inspect_args->file, "A lockstep checkpoint (.ckpt), a safetensors or a .pt file")
      ->required();
  inspect->add_flag("--json", inspect_args->json, "Print one JSON object instead of text");
  inspect->add_flag("--no-config", inspect_args->no_config, "Leave out the run's config");
  inspect->callback([inspect_args]() {
    nlohmann::json info = describe_file(inspect_args->file);
    if (inspect_args->no_config) info.erase("config");
    if (inspect_args->json) {
      std::cout << info.dump(2) << std::endl;
    } else {
      print_text(info, !inspect_args->no_config, std::cout);
    }
  });

  auto export_args = std::make_shared<ExportArguments>();
  CLI::App* exporter = ckpt->add_subcommand(
      "export", "Write a checkpoint's model weights as a safetensors file or a PyTorch state dict (.pt, torch.load)");
  exporter->add_option("file", export_args->file, "A lockstep checkpoint (.ckpt), or any weights file load_from reads")
      ->required();
  exporter->add_option("--format", export_args->format, "Output format")
      ->check(CLI::IsMember({"safetensors", "pt", "torchscript"}))
      ->capture_default_str();
  exporter->add_option("-o,--output", export_args->out, "The file to write")->required();
  exporter->add_flag("--ema", export_args->ema, "The EMAHook's averaged model instead of the trained weights");
  exporter->add_option("--dtype", export_args->dtype, "Cast floating-point weights (integer buffers keep theirs)")
      ->check(CLI::IsMember({"keep", "float32", "float16", "bfloat16"}))
      ->capture_default_str();
  exporter->callback([export_args]() {
    if (export_args->format == "torchscript") {
      if (export_args->ema) throw CLI::ValidationError("--ema", "export the average as safetensors or pt");
      if (export_args->dtype != "keep") {
        throw CLI::ValidationError("--dtype", "a TorchScript export keeps the module's own dtypes; drop --dtype");
      }
      const size_t count = export_torchscript(export_args->file, export_args->out);
      std::cout << "Wrote the TorchScript module of " << export_args->file << " (" << count << " tensors) to "
                << export_args->out << std::endl;
      return;
    }
    size_t count = export_weights(export_args->file, export_args->out,
                                  ExportOptions()
                                      .dtype(parse_export_dtype(export_args->dtype))
                                      .ema(export_args->ema)
                                      .format(export_args->format == "pt" ? ExportFormat::kPt
                                                                          : ExportFormat::kSafetensors));
    std::cout << "Wrote " << count << " tensors of " << export_args->file << " to " << export_args->out << std::endl;
  });

  auto diff_args = std::make_shared<DiffArguments>();
  CLI::App* differ = ckpt->add_subcommand(
      "diff", "Compare the model weights of two checkpoints; exit 0 when they match (bitwise unless --atol)");
  differ->add_option("first", diff_args->first, "A lockstep checkpoint (.ckpt)")->required();
  differ->add_option("second", diff_args->second, "Another lockstep checkpoint")->required();
  differ->add_option("--atol", diff_args->atol, "Largest absolute difference that still counts as equal")
      ->capture_default_str();
  differ->callback([diff_args]() {
    if (!diff_model_weights(*diff_args, std::cout)) throw CLI::RuntimeError(1);
  });
  return ckpt;
}

}  // namespace lockstep::cli
