#include "lockstep/launch/etcd_client.h"

#ifdef LOCKSTEP_WITH_CURL
#include <curl/curl.h>
#endif

#include <cstring>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

namespace lockstep {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// gRPC status codes etcd's gateway reports.
constexpr int kInvalidArgument = 3;
constexpr int kUnauthenticated = 16;
constexpr int kUnavailable = 14;
constexpr int kDeadlineExceeded = 4;  // e.g. "request timed out" while the members elect a leader

const char kBase64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string base64_encode(const std::string& bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const uint32_t n = (uint8_t(bytes[i]) << 16) | (uint8_t(bytes[i + 1]) << 8) | uint8_t(bytes[i + 2]);
    for (int shift : {18, 12, 6, 0}) out += kBase64[(n >> shift) & 63];
  }
  if (i < bytes.size()) {
    const bool two = i + 1 < bytes.size();
    const uint32_t n = (uint8_t(bytes[i]) << 16) | (two ? uint8_t(bytes[i + 1]) << 8 : 0);
    out += kBase64[(n >> 18) & 63];
    out += kBase64[(n >> 12) & 63];
    out += two ? kBase64[(n >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::string base64_decode(const std::string& text) {
  std::string out;
  uint32_t buffer = 0;
  int bits = 0;
  for (char c : text) {
    const char* at = c == '\0' ? nullptr : std::strchr(kBase64, c);
    if (at == nullptr) continue;  // '=' padding (and nothing else etcd sends)
    buffer = (buffer << 6) | static_cast<uint32_t>(at - kBase64);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((buffer >> bits) & 0xff);
    }
  }
  return out;
}

// The first key after every key that starts with `prefix` (etcd's range_end).
std::string prefix_end(std::string prefix) {
  while (!prefix.empty()) {
    if (static_cast<uint8_t>(prefix.back()) < 0xff) {
      prefix.back() = static_cast<char>(static_cast<uint8_t>(prefix.back()) + 1);
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');  // every key
}

// The gateway writes 64-bit integers as strings.
int64_t number(const json& object, const char* name) {
  auto it = object.find(name);
  if (it == object.end() || it->is_null()) return 0;
  if (it->is_string()) return std::stoll(it->get<std::string>());
  return it->get<int64_t>();
}

EtcdKeyValue key_value(const json& kv) {
  EtcdKeyValue result;
  result.key = base64_decode(kv.value("key", ""));
  result.value = base64_decode(kv.value("value", ""));
  result.create_revision = number(kv, "create_revision");
  result.mod_revision = number(kv, "mod_revision");
  result.lease = number(kv, "lease");
  return result;
}

json key_range(const std::string& prefix) {
  return {{"key", base64_encode(prefix)}, {"range_end", base64_encode(prefix_end(prefix))}};
}

// One HTTP POST. A `chunk` callback sees the answer as it streams in and
// returns false to end the transfer; `stop` is asked about once a second.
struct Transfer {
  // How the transfer ended, in the terms the client acts on.
  enum class Outcome {
    kOk,
    kDropped,  // the connection went after it was made (a TLS refusal looks so)
    kStopped,  // `stop` said so, or the time ran out
    kFailed,   // anything else: no connection, a bad URL
  };
  Outcome outcome = Outcome::kOk;
  std::string body;
  std::string error;
  std::string local_ip;
  std::function<bool(const std::string&)> chunk;
  std::function<bool()> stop;
};

#ifdef LOCKSTEP_WITH_CURL

void global_init() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

size_t on_write(char* data, size_t size, size_t count, void* user) {
  auto* transfer = static_cast<Transfer*>(user);
  const std::string piece(data, size * count);
  if (transfer->chunk) return transfer->chunk(piece) ? size * count : 0;
  transfer->body += piece;
  return size * count;
}

int on_progress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  auto* transfer = static_cast<Transfer*>(user);
  return transfer->stop && transfer->stop() ? 1 : 0;
}

Transfer::Outcome outcome_of(CURLcode code) {
  switch (code) {
    case CURLE_OK: return Transfer::Outcome::kOk;
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_SSL_CONNECT_ERROR: return Transfer::Outcome::kDropped;
    case CURLE_ABORTED_BY_CALLBACK:
    case CURLE_OPERATION_TIMEDOUT: return Transfer::Outcome::kStopped;
    default: return Transfer::Outcome::kFailed;
  }
}

void post(const EtcdOptions& options, const std::string& url, const std::string& body, const std::string& token,
          std::chrono::milliseconds timeout, Transfer& transfer) {
  CURL* curl = curl_easy_init();
  LOCKSTEP_CHECK(curl != nullptr, "etcd: curl_easy_init failed");
  char error[CURL_ERROR_SIZE] = {0};
  curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
  if (!token.empty()) headers = curl_slist_append(headers, ("Authorization: " + token).c_str());
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_POST, 1L);
  curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.c_str());
  curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, static_cast<long>(body.size()));
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_NOPROXY, "*");  // the cluster's own network, never a proxy
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error);
  // A member on a machine that is gone answers nothing: 2 s to connect, as etcdctl's --dial-timeout.
  const auto connect = std::min({timeout, options.request_timeout, std::chrono::milliseconds(2000)});
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(connect.count()));
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, static_cast<long>(timeout.count()));
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_write);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &transfer);
  if (transfer.stop) {
    curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(curl, CURLOPT_XFERINFODATA, &transfer);
  }
  if (!options.ca_file.empty()) curl_easy_setopt(curl, CURLOPT_CAINFO, options.ca_file.c_str());
  if (!options.cert_file.empty()) curl_easy_setopt(curl, CURLOPT_SSLCERT, options.cert_file.c_str());
  if (!options.key_file.empty()) curl_easy_setopt(curl, CURLOPT_SSLKEY, options.key_file.c_str());
  const CURLcode code = curl_easy_perform(curl);
  transfer.outcome = outcome_of(code);
  transfer.error = error[0] != '\0' ? error : curl_easy_strerror(code);
  char* ip = nullptr;
  if (curl_easy_getinfo(curl, CURLINFO_LOCAL_IP, &ip) == CURLE_OK && ip != nullptr) transfer.local_ip = ip;
  curl_slist_free_all(headers);
  curl_easy_cleanup(curl);
}

#else  // built without libcurl: no etcd client (Note [What make demo installs])

[[noreturn]] void no_curl() {
  LOCKSTEP_FAIL("etcd: this lockstep was built without libcurl, through which the etcd rendezvous speaks to etcd's "
                "JSON gateway: install Debian's libcurl4-openssl-dev and build again (`make test` installs it)");
}

void global_init() { no_curl(); }

void post(const EtcdOptions&, const std::string&, const std::string&, const std::string&, std::chrono::milliseconds,
          Transfer&) {
  no_curl();
}

#endif

// etcd's answer to a request it refused: {"error": ..., "code": N, "message": ...}.
struct Refusal {
  int code = 0;
  std::string message;
};
std::optional<Refusal> refusal(const json& answer) {
  const json* error = &answer;
  if (answer.contains("error") && answer["error"].is_object()) error = &answer["error"];  // a stream's
  if (!error->contains("code") && !error->contains("grpc_code")) return std::nullopt;
  Refusal r;
  r.code = static_cast<int>(error->contains("code") ? number(*error, "code") : number(*error, "grpc_code"));
  r.message = error->value("message", error->value("error", std::string("(no message)")));
  if (r.code == 0) return std::nullopt;
  return r;
}

// What a failed transfer means, for the error message. A member that checks
// client certificates (--client-cert-auth) ends the connection right after
// the TLS handshake when it does not trust the certificate (TLS 1.3), and
// curl only sees the connection go.
std::string failure(const EtcdOptions& options, const std::string& url, const Transfer& transfer) {
  const bool tls = url.rfind("https://", 0) == 0;
  const bool dropped = transfer.outcome == Transfer::Outcome::kDropped;
  std::string hint;
  if (tls && dropped) {
    hint = options.cert_file.empty()
               ? "; if the member checks client certificates, give one: --rdzv-conf cert=FILE,key=FILE"
               : str_cat("; the member refused the TLS connection: is this client's certificate (", options.cert_file,
                         ") signed by a CA the cluster trusts (etcd's --trusted-ca-file)?");
  }
  return str_cat(url, " (", transfer.error, hint, ")");
}

std::string with_scheme(const std::string& endpoint, const std::string& protocol) {
  if (endpoint.find("://") != std::string::npos) return endpoint;
  return protocol + "://" + endpoint;
}

}  // namespace

std::vector<std::string> split_etcd_endpoints(const std::string& text) {
  std::vector<std::string> endpoints;
  std::istringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) endpoints.push_back(item);
  }
  LOCKSTEP_CHECK(!endpoints.empty(), "etcd: no endpoint in '", text, "' (HOST:PORT[,HOST:PORT...])");
  return endpoints;
}

EtcdClient::EtcdClient(EtcdOptions options) : options_(std::move(options)) {
  global_init();
  LOCKSTEP_CHECK(!options_.endpoints.empty(), "etcd: no endpoints given");
  LOCKSTEP_CHECK(options_.protocol == "http" || options_.protocol == "https", "etcd: protocol '", options_.protocol,
                 "' is neither http nor https");
  for (const auto& endpoint : options_.endpoints) urls_.push_back(with_scheme(endpoint, options_.protocol));
  for (const auto* file : {&options_.ca_file, &options_.cert_file, &options_.key_file}) {
    LOCKSTEP_CHECK(file->empty() || std::ifstream(*file).good(), "etcd: cannot read '", *file, "'");
  }
}

EtcdClient::~EtcdClient() = default;

std::string EtcdClient::endpoints() const {
  std::string text;
  for (const auto& url : urls_) text += (text.empty() ? "" : ", ") + url;
  return text;
}

void EtcdClient::authenticate(size_t endpoint) {
  Transfer transfer;
  const json request = {{"name", options_.user}, {"password", options_.password}};
  post(options_, urls_[endpoint] + "/v3/auth/authenticate", request.dump(), "", options_.request_timeout, transfer);
  if (transfer.outcome != Transfer::Outcome::kOk) throw EtcdError(failure(options_, urls_[endpoint], transfer));
  const json answer = json::parse(transfer.body, nullptr, false);
  if (auto r = refusal(answer)) {
    throw EtcdRefusedError(str_cat("etcd at ", urls_[endpoint], " refused user '", options_.user, "': ", r->message));
  }
  token_ = answer.value("token", "");
}

std::string EtcdClient::call(const std::string& path, const std::string& body) {
  std::string failures;
  for (size_t attempt = 0; attempt < urls_.size(); ++attempt) {
    const size_t index = (current_ + attempt) % urls_.size();
    const std::string& url = urls_[index];
    try {
      for (int tries = 0; tries < 2; ++tries) {
        if (!options_.user.empty() && token_.empty()) authenticate(index);
        Transfer transfer;
        post(options_, url + path, body, token_, options_.request_timeout, transfer);
        if (transfer.outcome != Transfer::Outcome::kOk) throw EtcdError(failure(options_, url, transfer));
        const json answer = json::parse(transfer.body, nullptr, false);
        if (answer.is_discarded()) throw EtcdError(str_cat(url, " (an answer that is not JSON: ", transfer.body, ")"));
        if (auto r = refusal(answer)) {
          const bool token_expired = r->message.find("invalid auth token") != std::string::npos;
          if ((r->code == kUnauthenticated || (r->code == kInvalidArgument && token_expired)) &&
              !options_.user.empty() && tries == 0) {
            token_.clear();  // expired: authenticate again
            continue;
          }
          if (r->code == kUnavailable || r->code == kDeadlineExceeded) {
            throw EtcdError(str_cat(url, " (", r->message, ")"));  // no leader for now: the next member
          }
          throw EtcdRefusedError(str_cat("etcd at ", url, " refused ", path, ": ", r->message));
        }
        current_ = index;
        local_address_ = transfer.local_ip;
        return transfer.body;
      }
    } catch (const EtcdRefusedError&) {
      throw;
    } catch (const EtcdError& error) {
      failures += (failures.empty() ? "" : "; ") + std::string(error.what());
    }
  }
  throw EtcdError(str_cat("cannot reach etcd at any of its endpoints: ", failures));
}

std::optional<EtcdKeyValue> EtcdClient::get(const std::string& key, int64_t* revision) {
  const json answer = json::parse(call("/v3/kv/range", json{{"key", base64_encode(key)}}.dump()));
  if (revision != nullptr) *revision = number(answer.value("header", json::object()), "revision");
  if (!answer.contains("kvs") || answer["kvs"].empty()) return std::nullopt;
  return key_value(answer["kvs"][0]);
}

std::vector<EtcdKeyValue> EtcdClient::get_prefix(const std::string& prefix, int64_t* revision) {
  const json answer = json::parse(call("/v3/kv/range", key_range(prefix).dump()));
  if (revision != nullptr) *revision = number(answer.value("header", json::object()), "revision");
  std::vector<EtcdKeyValue> result;
  for (const auto& kv : answer.value("kvs", json::array())) result.push_back(key_value(kv));
  return result;
}

namespace {
json put_request(const std::string& key, const std::string& value, int64_t lease) {
  json put = {{"key", base64_encode(key)}, {"value", base64_encode(value)}};
  if (lease != 0) put["lease"] = std::to_string(lease);
  return put;
}
}  // namespace

void EtcdClient::put(const std::string& key, const std::string& value, int64_t lease) {
  call("/v3/kv/put", put_request(key, value, lease).dump());
}

bool EtcdClient::create(const std::string& key, const std::string& value, int64_t lease) {
  return put_if(key, value, 0, lease);
}

bool EtcdClient::put_if(const std::string& key, const std::string& value, int64_t mod_revision, int64_t lease) {
  json txn = {{"compare", json::array({{{"key", base64_encode(key)}, {"target", "MOD"},
                                        {"mod_revision", std::to_string(mod_revision)}}})},
              {"success", json::array({{{"request_put", put_request(key, value, lease)}}})}};
  return json::parse(call("/v3/kv/txn", txn.dump())).value("succeeded", false);
}

bool EtcdClient::create_all(const std::string& guard, const std::vector<std::pair<std::string, std::string>>& puts) {
  json success = json::array();
  for (const auto& [key, value] : puts) success.push_back({{"request_put", put_request(key, value, 0)}});
  json txn = {{"compare", json::array({{{"key", base64_encode(guard)}, {"target", "CREATE"}, {"create_revision", "0"}}})},
              {"success", success}};
  return json::parse(call("/v3/kv/txn", txn.dump())).value("succeeded", false);
}

void EtcdClient::erase(const std::string& key) {
  call("/v3/kv/deleterange", json{{"key", base64_encode(key)}}.dump());
}

bool EtcdClient::erase_prefix_if(const std::string& prefix, const std::string& guard, int64_t guard_revision) {
  json txn = {{"compare", json::array({{{"key", base64_encode(guard)}, {"target", "MOD"},
                                        {"mod_revision", std::to_string(guard_revision)}}})},
              {"success", json::array({{{"request_delete_range", key_range(prefix)}}})}};
  return json::parse(call("/v3/kv/txn", txn.dump())).value("succeeded", false);
}

int64_t EtcdClient::grant_lease(std::chrono::seconds ttl) {
  const json answer = json::parse(call("/v3/lease/grant", json{{"TTL", std::to_string(ttl.count())}}.dump()));
  const int64_t id = number(answer, "ID");
  LOCKSTEP_CHECK(id != 0, "etcd at ", endpoints(), " granted no lease: ", answer.dump());
  return id;
}

bool EtcdClient::keep_alive(int64_t lease) {
  const json answer = json::parse(call("/v3/lease/keepalive", json{{"ID", std::to_string(lease)}}.dump()));
  // {"result": {"ID": ..., "TTL": ...}}; an expired lease answers TTL 0 (or none).
  const json& result = answer.contains("result") ? answer["result"] : answer;
  return number(result, "TTL") > 0;
}

void EtcdClient::revoke_lease(int64_t lease) {
  call("/v3/lease/revoke", json{{"ID", std::to_string(lease)}}.dump());
}

int64_t EtcdClient::watch_prefix(const std::string& prefix, int64_t after_revision, std::chrono::milliseconds timeout,
                                 const std::function<bool()>& stop) {
  const auto deadline = Clock::now() + timeout;
  json create = key_range(prefix);
  create["start_revision"] = std::to_string(after_revision + 1);
  const std::string body = json{{"create_request", create}}.dump();
  int64_t seen = after_revision;
  for (size_t attempt = 0; Clock::now() < deadline && !stop(); ++attempt) {
    const size_t index = (current_ + attempt) % urls_.size();
    if (!options_.user.empty() && token_.empty()) {
      try {
        authenticate(index);
      } catch (const EtcdError&) {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        continue;
      }
    }
    Transfer transfer;
    std::string pending;
    bool changed = false, created = false;
    std::optional<Refusal> refused;
    transfer.chunk = [&](const std::string& piece) {
      pending += piece;
      size_t end;
      while ((end = pending.find('\n')) != std::string::npos) {
        const json message = json::parse(pending.substr(0, end), nullptr, false);
        pending.erase(0, end + 1);
        if (message.is_discarded()) continue;
        if ((refused = refusal(message))) return false;
        created = true;
        const json& result = message.value("result", json::object());
        const int64_t revision = number(result.value("header", json::object()), "revision");
        if (result.contains("events") && !result["events"].empty()) {
          for (const auto& event : result["events"]) seen = std::max(seen, number(event.value("kv", json::object()), "mod_revision"));
          seen = std::max(seen, revision);
          changed = true;
          return false;
        }
        if (result.value("canceled", false)) {  // compacted past after_revision: read everything again
          seen = std::max(seen, revision);
          changed = true;
          return false;
        }
      }
      return true;
    };
    transfer.stop = [&] { return stop() || Clock::now() >= deadline; };
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    post(options_, urls_[index] + "/v3/watch", body, token_, left + std::chrono::seconds(1), transfer);
    if (changed) {
      current_ = index;
      return seen;
    }
    if (refused) {
      if (refused->code == kUnauthenticated && !options_.user.empty()) {
        token_.clear();
        continue;
      }
      throw EtcdRefusedError(str_cat("etcd at ", urls_[index], " refused a watch of '", prefix, "': ", refused->message));
    }
    if (transfer.outcome == Transfer::Outcome::kStopped) {
      // A member that never confirmed the watch may be on a machine that is
      // gone (no reset comes from there): the next request tries another.
      if (!created) current_ = (index + 1) % urls_.size();
      break;
    }
    // The endpoint went away (or never answered): the next one, from the same revision.
    if ((attempt + 1) % urls_.size() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return seen;
}

}  // namespace lockstep
