// A client of etcd's v3 API over its JSON gateway (etcd 3.4 and later serve
// it on the client port: POST /v3/kv/range, /v3/kv/txn, /v3/lease/grant,
// /v3/watch, ...), through libcurl. It is what `lockstep run --rdzv-backend
// etcd` keeps its rendezvous on (lockstep/launch/etcd_rendezvous.h).
//
//   lockstep::EtcdOptions o;
//   o.endpoints = {"10.0.0.1:2379", "10.0.0.2:2379", "10.0.0.3:2379"};  // tried in turn
//   o.ca_file = "ca.pem"; o.cert_file = "node.pem"; o.key_file = "node-key.pem";  // https, client certificate
//   lockstep::EtcdClient etcd(o);
//   const int64_t lease = etcd.grant_lease(std::chrono::seconds(10));
//   if (etcd.create("/job/round/0/node/a", "hello", lease)) { /* first to create it */ }
//   auto kvs = etcd.get_prefix("/job/round/0/");
//   etcd.keep_alive(lease);                                  // every few seconds, or the key goes
//   etcd.watch_prefix("/job/", revision, std::chrono::seconds(5), [] { return false; });
//
// Endpoints: "host:port", or with a scheme ("https://host:port"); those
// without one use `protocol`. A request goes to the endpoint that answered
// last and, when it cannot be reached (refused, timed out, TLS handshake
// failed), to the next; when none answers the error names every endpoint and
// why each failed. With `user` set the client authenticates (etcd's
// user/password auth) and sends the token with every request, authenticating
// again when etcd says the token expired. Keys and values are bytes (base64 on
// the wire). One client is for one thread at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <c10/macros/Macros.h>

#include "lockstep/core/error.h"

namespace lockstep {

struct EtcdOptions {
  std::vector<std::string> endpoints;
  std::string protocol = "http";  // for endpoints without a scheme: http or https
  std::string ca_file;            // https: the CA that signed the servers' certificates
  std::string cert_file;          // https: this client's certificate and key (etcd's --client-cert-auth)
  std::string key_file;
  std::string user;               // etcd's user/password auth (with `password`)
  std::string password;
  std::chrono::milliseconds request_timeout{5000};  // one request to one endpoint
};

// No endpoint could be reached (or none had a leader): worth trying again.
class EtcdError : public Error {
 public:
  using Error::Error;
};

// etcd answered and said no (permission denied, wrong password, a lease it
// does not know): trying again gives the same answer.
class EtcdRefusedError : public EtcdError {
 public:
  using EtcdError::EtcdError;
};

struct EtcdKeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;  // the store's revision when the key was created: orders arrivals
  int64_t mod_revision = 0;
  int64_t lease = 0;
};

class EtcdClient {
 public:
  explicit EtcdClient(EtcdOptions options);
  ~EtcdClient();
  C10_DISABLE_COPY_AND_ASSIGN(EtcdClient);

  // `revision` receives the store's revision the answer reflects.
  std::optional<EtcdKeyValue> get(const std::string& key, int64_t* revision = nullptr);
  // Every key that starts with `prefix`, by key; `revision` receives the
  // store's revision the answer reflects (watch from revision + 1).
  std::vector<EtcdKeyValue> get_prefix(const std::string& prefix, int64_t* revision = nullptr);
  void put(const std::string& key, const std::string& value, int64_t lease = 0);
  // Puts only if the key does not exist; true when this call created it.
  bool create(const std::string& key, const std::string& value, int64_t lease = 0);
  // Puts only if the key was last modified at `mod_revision` (0: it does not
  // exist): a compare-and-swap. True when this call put it.
  bool put_if(const std::string& key, const std::string& value, int64_t mod_revision, int64_t lease = 0);
  // Creates every key of `puts` only if `guard` does not exist, all at once.
  bool create_all(const std::string& guard, const std::vector<std::pair<std::string, std::string>>& puts);
  void erase(const std::string& key);
  // Erases every key that starts with `prefix` if `guard` was last modified
  // at `guard_revision` (mod_revision); true when it did.
  bool erase_prefix_if(const std::string& prefix, const std::string& guard, int64_t guard_revision);

  // A lease of `ttl`: keys put with it vanish when it is not kept alive.
  int64_t grant_lease(std::chrono::seconds ttl);
  // Renews the lease; false when it has already expired.
  bool keep_alive(int64_t lease);
  void revoke_lease(int64_t lease);

  // Waits for a change under `prefix` at a revision after `after_revision`,
  // for at most `timeout` or until `stop` returns true (asked about once a
  // second). Returns the revision of the last change seen, or
  // `after_revision` when none came. A watch whose endpoint fails goes on on
  // the next one, from the same revision.
  int64_t watch_prefix(const std::string& prefix, int64_t after_revision, std::chrono::milliseconds timeout,
                       const std::function<bool()>& stop);

  // The address this machine used to reach etcd last (the local end of the
  // connection): what peers that reach etcd can reach it at. Empty before
  // the first request.
  std::string local_address() const { return local_address_; }
  // "a:2379, b:2379" for messages.
  std::string endpoints() const;

 private:
  // POSTs `body` to `path` on one endpoint after another until one answers;
  // returns the answer, or throws EtcdRefusedError (an answer that says no) or
  // EtcdError (no member answered).
  std::string call(const std::string& path, const std::string& body);
  void authenticate(size_t endpoint);

  EtcdOptions options_;
  std::vector<std::string> urls_;  // scheme://host:port
  size_t current_ = 0;
  std::string token_;
  std::string local_address_;
};

// "a:2379,b:2379" -> {"a:2379", "b:2379"}; throws naming `text` when empty.
std::vector<std::string> split_etcd_endpoints(const std::string& text);

}  // namespace lockstep
