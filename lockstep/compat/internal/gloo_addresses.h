// The value a Gloo rank sets for its full mesh ("<prefix>/<rank>" in the
// group's store), in the forms the Gloo versions libtorch links set, and the
// part of it each peer reads: what lets the address table hand each rank only
// its parts (Note [Each rank reads its own part], comm/store_views.cpp).
//
// - kPairAddresses (Gloo before 2023-07, libtorch 1.13's): N - 1 addresses,
//   one per peer in rank order, each a tcp::Address (a sockaddr_storage and
//   a sequence number, 136 bytes). Peer r reads only the one meant for it.
// - kRankRecord (Gloo since 2023-07, libtorch 2.x's): a host name, the
//   device's address and N pair numbers (8 bytes each). Peer r reads the host
//   name, the address and pair number r.
// - kOpaque: neither, or not recognised: every peer reads the whole value.
//
//   auto format = compat::detect_gloo_address_format(values);   // rank 0, every rank's value
//   auto part = compat::gloo_address_part(format, values[owner], owner, reader, size);
//   auto as_gloo_reads_it = compat::gloo_address_from_part(format, part, owner, reader, size);
#pragma once

#include <cstdint>
#include <vector>

namespace lockstep::compat {

enum class GlooAddressFormat : uint8_t { kOpaque = 0, kPairAddresses = 1, kRankRecord = 2 };

// The format every one of `values` (each rank's, by rank) has, checked field
// by field; kOpaque unless all of them have the same one.
GlooAddressFormat detect_gloo_address_format(const std::vector<std::vector<uint8_t>>& values);

// What Gloo on `reader` reads of `owner`'s value, in a group of `size` ranks
// (the whole value for kOpaque).
std::vector<uint8_t> gloo_address_part(GlooAddressFormat format, const std::vector<uint8_t>& value, int owner,
                                       int reader, int size);

// A value that Gloo on `reader` reads exactly as it reads `owner`'s, made from
// its part: every byte Gloo reads there is the part's, the rest are zero.
std::vector<uint8_t> gloo_address_from_part(GlooAddressFormat format, const std::vector<uint8_t>& part, int owner,
                                            int reader, int size);

}  // namespace lockstep::compat
