#include "lockstep/compat/internal/gloo_addresses.h"

#include <sys/socket.h>

#include <cstring>

#include "lockstep/core/error.h"

namespace lockstep::compat {
namespace {

// gloo::transport::tcp::Address::bytes(): a sockaddr_storage, then the pair's
// sequence number (ssize_t), in both Gloo versions.
constexpr size_t kAddressBytes = sizeof(sockaddr_storage) + sizeof(int64_t);
// Gloo's rendezvous reads at most 256 bytes of host name (HOSTNAME_MAX_SIZE).
constexpr uint64_t kMaxHostName = 256;

bool is_socket_address(const uint8_t* bytes) {
  sa_family_t family = 0;
  std::memcpy(&family, bytes, sizeof(family));
  return family == AF_INET || family == AF_INET6;
}

// The (N - 1) peers' addresses of one rank (Gloo before 2023-07).
bool is_pair_addresses(const std::vector<uint8_t>& value, int size) {
  if (size < 2 || value.size() != kAddressBytes * static_cast<size_t>(size - 1)) return false;
  for (size_t at = 0; at < value.size(); at += kAddressBytes) {
    if (!is_socket_address(value.data() + at)) return false;
  }
  return true;
}

// Gloo's tcp::Rank::bytes(): host name length and bytes, address length and
// bytes, then `size` pair numbers. Returns where the pair numbers begin, or 0.
size_t rank_record_numbers_at(const std::vector<uint8_t>& value, int size) {
  uint64_t host_name = 0, address = 0;
  if (value.size() < 2 * sizeof(uint64_t)) return 0;
  std::memcpy(&host_name, value.data(), sizeof(host_name));
  if (host_name > kMaxHostName || value.size() < 2 * sizeof(uint64_t) + host_name) return 0;
  std::memcpy(&address, value.data() + sizeof(uint64_t) + host_name, sizeof(address));
  const size_t numbers_at = 2 * sizeof(uint64_t) + host_name + address;
  if (address != kAddressBytes || value.size() < numbers_at) return 0;
  if (!is_socket_address(value.data() + 2 * sizeof(uint64_t) + host_name)) return 0;
  return value.size() - numbers_at == sizeof(int64_t) * static_cast<size_t>(size) ? numbers_at : 0;
}

GlooAddressFormat format_of(const std::vector<uint8_t>& value, int size) {
  if (is_pair_addresses(value, size)) return GlooAddressFormat::kPairAddresses;
  if (rank_record_numbers_at(value, size) != 0) return GlooAddressFormat::kRankRecord;
  return GlooAddressFormat::kOpaque;
}

// Where Gloo before 2023-07 finds the address `owner` made for `reader`: its
// list skips the owner itself (rendezvous::Context::extractAddress).
size_t pair_address_index(int owner, int reader) { return static_cast<size_t>(reader > owner ? reader - 1 : reader); }

}  // namespace

GlooAddressFormat detect_gloo_address_format(const std::vector<std::vector<uint8_t>>& values) {
  const int size = static_cast<int>(values.size());
  if (values.empty()) return GlooAddressFormat::kOpaque;
  const GlooAddressFormat first = format_of(values.front(), size);
  for (const auto& value : values) {
    if (format_of(value, size) != first) return GlooAddressFormat::kOpaque;
  }
  return first;
}

std::vector<uint8_t> gloo_address_part(GlooAddressFormat format, const std::vector<uint8_t>& value, int owner,
                                       int reader, int size) {
  switch (format) {
    case GlooAddressFormat::kPairAddresses: {
      LOCKSTEP_CHECK(is_pair_addresses(value, size), "rank ", owner, "'s Gloo addresses are not ", size - 1,
                     " peer addresses");
      const auto begin = value.begin() + static_cast<std::ptrdiff_t>(pair_address_index(owner, reader) * kAddressBytes);
      return std::vector<uint8_t>(begin, begin + static_cast<std::ptrdiff_t>(kAddressBytes));
    }
    case GlooAddressFormat::kRankRecord: {
      const size_t numbers_at = rank_record_numbers_at(value, size);
      LOCKSTEP_CHECK(numbers_at != 0, "rank ", owner, "'s Gloo address is not a record for ", size, " ranks");
      std::vector<uint8_t> part(value.begin(), value.begin() + static_cast<std::ptrdiff_t>(numbers_at));
      const auto number = value.begin() + static_cast<std::ptrdiff_t>(numbers_at + sizeof(int64_t) * reader);
      part.insert(part.end(), number, number + static_cast<std::ptrdiff_t>(sizeof(int64_t)));
      return part;
    }
    case GlooAddressFormat::kOpaque:
      break;
  }
  return value;
}

std::vector<uint8_t> gloo_address_from_part(GlooAddressFormat format, const std::vector<uint8_t>& part, int owner,
                                            int reader, int size) {
  switch (format) {
    case GlooAddressFormat::kPairAddresses: {
      LOCKSTEP_CHECK(part.size() == kAddressBytes, "rank ", owner, "'s Gloo address for rank ", reader, " has ",
                     part.size(), " bytes, not ", kAddressBytes);
      std::vector<uint8_t> value(kAddressBytes * static_cast<size_t>(size - 1), 0);
      std::memcpy(value.data() + pair_address_index(owner, reader) * kAddressBytes, part.data(), kAddressBytes);
      return value;
    }
    case GlooAddressFormat::kRankRecord: {
      LOCKSTEP_CHECK(part.size() > sizeof(int64_t), "rank ", owner, "'s Gloo record for rank ", reader,
                     " is truncated");
      const size_t numbers_at = part.size() - sizeof(int64_t);
      std::vector<uint8_t> value(part.begin(), part.begin() + static_cast<std::ptrdiff_t>(numbers_at));
      value.resize(numbers_at + sizeof(int64_t) * static_cast<size_t>(size), 0);
      std::memcpy(value.data() + numbers_at + sizeof(int64_t) * reader, part.data() + numbers_at, sizeof(int64_t));
      return value;
    }
    case GlooAddressFormat::kOpaque:
      break;
  }
  return part;
}

}  // namespace lockstep::compat
