#include "lockstep/launch/rendezvous_args.h"

#include <sstream>

#include "lockstep/core/error.h"

namespace lockstep {

namespace {

template <typename T>
T parse_number(const std::string& text, const std::string& what) {
  std::istringstream in(text);
  T value{};
  in >> value;
  LOCKSTEP_CHECK(!text.empty() && !in.fail() && in.eof(), "lockstep run: ", what, ": '", text, "' is not a number");
  return value;
}

}  // namespace

void apply_nnodes(const std::string& text, LaunchOptions& options) {
  const auto colon = text.find(':');
  if (colon == std::string::npos) {
    options.nnodes(parse_number<int>(text, "--nnodes")).min_nodes(0);
    return;
  }
  const int min_nodes = parse_number<int>(text.substr(0, colon), "--nnodes MIN:MAX");
  const int max_nodes = parse_number<int>(text.substr(colon + 1), "--nnodes MIN:MAX");
  LOCKSTEP_CHECK(min_nodes >= 1 && min_nodes <= max_nodes, "lockstep run: --nnodes ", text,
                 ": needs 1 <= MIN <= MAX");
  options.min_nodes(min_nodes).nnodes(max_nodes);
}

void apply_rdzv_endpoint(const std::string& text, LaunchOptions& options) {
  const auto colon = text.rfind(':');
  const bool has_port = colon != std::string::npos && text.find(']', colon) == std::string::npos;
  const std::string host = has_port ? text.substr(0, colon) : text;
  LOCKSTEP_CHECK(!host.empty(), "lockstep run: --rdzv-endpoint '", text, "' names no host (HOST[:PORT])");
  // etcd's backend reads a list of endpoints; c10d's one host.
  options.etcd().endpoints = split_etcd_endpoints(text);
  if (text.find(',') != std::string::npos) return;
  options.master_addr(host);
  options.master_port(has_port ? parse_number<int>(text.substr(colon + 1), "--rdzv-endpoint port") : 29400);
}

void apply_rdzv_conf(const std::string& text, LaunchOptions& options) {
  std::istringstream entries(text);
  std::string entry;
  while (std::getline(entries, entry, ',')) {
    if (entry.empty()) continue;
    const auto equals = entry.find('=');
    LOCKSTEP_CHECK(equals != std::string::npos, "lockstep run: --rdzv-conf: '", entry, "' is not KEY=VALUE");
    const std::string key = entry.substr(0, equals), value = entry.substr(equals + 1);
    if (key == "last_call_timeout") {
      options.last_call_timeout(parse_number<double>(value, "--rdzv-conf last_call_timeout"));
    } else if (key == "join_timeout") {
      options.join_timeout(parse_number<double>(value, "--rdzv-conf join_timeout"));
    } else if (key == "lease_ttl") {
      options.lease_ttl(parse_number<double>(value, "--rdzv-conf lease_ttl"));
    } else if (key == "protocol") {
      LOCKSTEP_CHECK(value == "http" || value == "https", "lockstep run: --rdzv-conf protocol=", value,
                     ": http or https");
      options.etcd().protocol = value;
    } else if (key == "cacert") {
      options.etcd().ca_file = value;
    } else if (key == "cert") {
      options.etcd().cert_file = value;
    } else if (key == "key") {
      options.etcd().key_file = value;
    } else if (key == "user") {
      options.etcd().user = value;
    } else {
      LOCKSTEP_FAIL("lockstep run: --rdzv-conf: unknown key '", key,
                    "' (lockstep's rendezvous reads last_call_timeout and join_timeout; etcd's also lease_ttl, "
                    "protocol, cacert, cert, key and user)");
    }
  }
}

}  // namespace lockstep
