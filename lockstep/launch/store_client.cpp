#include "lockstep/launch/store_client.h"

#include <algorithm>

namespace lockstep {

c10::intrusive_ptr<compat::C10dStore> connect_store(const std::string& host, int port,
                                                    std::chrono::milliseconds timeout) {
  compat::TcpStoreSpec spec;
  spec.host = host;
  spec.port = port;
  spec.timeout = std::max<std::chrono::milliseconds>(timeout, std::chrono::seconds(1));
  return compat::make_tcp_store(spec).first;
}

}  // namespace lockstep
