#include "lockstep/comm/job_identity.h"

#include <array>
#include <cstdint>
#include <cstdio>
#include <random>
#include <thread>

#include "lockstep/core/error.h"
#include "lockstep/comm/work.h"

namespace lockstep {

namespace {

constexpr std::array<uint32_t, 64> kRound{
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

// Two hashes of the token, each with its own leading string (Note [The store's job token]).

std::string to_string(const std::vector<uint8_t>& bytes) { return std::string(bytes.begin(), bytes.end()); }

}  // namespace

std::string sha256_hex(const std::string& data) {
  std::array<uint32_t, 8> h{0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                            0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  std::string message = data;
  const uint64_t bits = static_cast<uint64_t>(data.size()) * 8;
  message.push_back(static_cast<char>(0x80));
  while (message.size() % 64 != 56) message.push_back('\0');
  for (int i = 7; i >= 0; --i) message.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
  for (size_t block = 0; block < message.size(); block += 64) {
    std::array<uint32_t, 64> w{};
    for (int i = 0; i < 16; ++i) {
      for (int b = 0; b < 4; ++b) {
        w[i] = (w[i] << 8) | static_cast<uint8_t>(message[block + static_cast<size_t>(4 * i + b)]);
      }
    }
    for (int i = 16; i < 64; ++i) {
      const uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      const uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    auto v = h;
    for (int i = 0; i < 64; ++i) {
      const uint32_t s1 = rotr(v[4], 6) ^ rotr(v[4], 11) ^ rotr(v[4], 25);
      const uint32_t choose = (v[4] & v[5]) ^ (~v[4] & v[6]);
      const uint32_t t1 = v[7] + s1 + choose + kRound[static_cast<size_t>(i)] + w[static_cast<size_t>(i)];
      const uint32_t s0 = rotr(v[0], 2) ^ rotr(v[0], 13) ^ rotr(v[0], 22);
      const uint32_t majority = (v[0] & v[1]) ^ (v[0] & v[2]) ^ (v[1] & v[2]);
      const uint32_t t2 = s0 + majority;
      v = {t1 + t2, v[0], v[1], v[2], v[3] + t1, v[4], v[5], v[6]};
    }
    for (size_t i = 0; i < 8; ++i) h[i] += v[i];
  }
  static const char* const kHex = "0123456789abcdef";
  std::string out;
  for (uint32_t word : h) {
    for (int shift = 28; shift >= 0; shift -= 4) out.push_back(kHex[(word >> shift) & 0xf]);
  }
  return out;
}

std::string job_check_value(const JobIdentity& job) { return sha256_hex("lockstep-job-check:" + job.token); }

std::string job_key_prefix(const JobIdentity& job) {
  return "job/" + sha256_hex("lockstep-job-keys:" + job.token) + "/";
}

std::string random_job_token() {
  std::random_device device;
  char buffer[40];
  std::snprintf(buffer, sizeof(buffer), "%08x%08x%08x%08x", device(), device(), device(), device());
  return buffer;
}

c10::intrusive_ptr<compat::C10dStore> publish_job(const c10::intrusive_ptr<compat::C10dStore>& store,
                                                  const JobIdentity& job) {
  LOCKSTEP_CHECK(!job.token.empty(), "publish_job: the job token is empty");
  const std::string record = job.run_id + "\n" + job_check_value(job);
  store->set(kJobRecordKey, std::vector<uint8_t>(record.begin(), record.end()));
  return compat::make_prefix_store(job_key_prefix(job), store);
}

c10::intrusive_ptr<compat::C10dStore> join_job(const c10::intrusive_ptr<compat::C10dStore>& store,
                                               const JobIdentity& job, std::chrono::milliseconds timeout,
                                               const std::string& where, std::string* run_id_out) {
  const std::string refused = "refused by the job at " + where + ": ";
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::milliseconds(2);
  while (!store->check({kJobRecordKey})) {
    if (std::chrono::steady_clock::now() >= deadline) {
      throw TimeoutError(str_cat(refused, "no lockstep job record appeared within ", detail::format_duration(timeout),
                                 " (is the store a lockstep launcher's, and is node 0 running?)"));
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(100));
  }
  const std::string record = to_string(store->get(kJobRecordKey));
  const size_t newline = record.find('\n');
  LOCKSTEP_CHECK(newline != std::string::npos, refused, "its job record is malformed");
  const std::string host_run_id = record.substr(0, newline);
  LOCKSTEP_CHECK(job.run_id.empty() || job.run_id == host_run_id, refused, "it is job '", host_run_id,
                 "' and this process belongs to job '", job.run_id, "' (another job on the same address and port?)");
  LOCKSTEP_CHECK(!job.token.empty(), refused, "the job requires a job token: set LOCKSTEP_JOB_TOKEN (or lockstep run "
                 "--job-token) to the token the job was started with");
  LOCKSTEP_CHECK(record.substr(newline + 1) == job_check_value(job), refused, "wrong job token (LOCKSTEP_JOB_TOKEN or "
                 "--job-token must be the same on every node of job '", host_run_id, "')");
  if (run_id_out != nullptr) *run_id_out = host_run_id;
  return compat::make_prefix_store(job_key_prefix(job), store);
}

}  // namespace lockstep
