# Network hosts of the project's own for multi-host tests: Linux network
# namespaces, each with one interface (eth0) plugged into a bridge that lives
# in a "switch" namespace, on a private subnet that exists inside these
# namespaces only. Nothing is changed in the machine's own network namespace.
#
#   source tests/multinode/netns_hosts.sh
#   netns_hosts_usable || exit 77       # prints why not (not root, no iproute2, ...)
#   netns_hosts_up lsmn 2               # hosts lsmn-h0 (10.213.0.1), lsmn-h1 (10.213.0.2)
#   trap netns_hosts_down EXIT          # removed afterwards, even on failure
#   on_host 1 lockstep run --nnodes 2 --node-rank 1 --master-addr "$(host_addr 0)" ...
#   link_down 1; link_up 1              # pull / plug host 1's cable at the switch
#   host_pids 1                         # what still runs on host 1
#   netns_hosts_down                    # kills what still runs there, removes everything
#
# netns_hosts_up first removes leftovers of an earlier run with the same prefix
# (one that was killed before its trap could run).

NETNS_PREFIX=""
NETNS_SUBNET="10.213.0"

netns_hosts_usable() {
  if [ "$(id -u)" != 0 ]; then
    echo "network namespaces need root (uid $(id -u))"
    return 1
  fi
  if ! command -v ip >/dev/null 2>&1; then
    echo "no 'ip' command (Debian package iproute2)"
    return 1
  fi
  local probe="lsprobe$$"
  if ! ip netns add "$probe" 2>/dev/null; then
    echo "cannot create a network namespace here (ip netns add failed: a container without CAP_SYS_ADMIN?)"
    return 1
  fi
  local usable=0
  if ! ip netns exec "$probe" ip link add br0 type bridge 2>/dev/null ||
    ! ip netns exec "$probe" ip link add va type veth peer name vb 2>/dev/null; then
    echo "cannot create bridge or veth devices in a network namespace"
    usable=1
  fi
  ip netns del "$probe" 2>/dev/null
  return $usable
}

host_ns() { echo "$NETNS_PREFIX-h$1"; }
host_addr() { echo "$NETNS_SUBNET.$(($1 + 1))"; }
on_host() {
  local host=$1
  shift
  ip netns exec "$(host_ns "$host")" "$@"
}
link_down() { ip netns exec "$NETNS_PREFIX-sw" ip link set "port$1" down; }
link_up() { ip netns exec "$NETNS_PREFIX-sw" ip link set "port$1" up; }
host_pids() { ip netns pids "$(host_ns "$1")" 2>/dev/null; }

netns_hosts_up() {
  NETNS_PREFIX=$1
  local count=$2 i ns
  netns_hosts_down
  ip netns add "$NETNS_PREFIX-sw" || return 1
  ip netns exec "$NETNS_PREFIX-sw" ip link add br0 type bridge || return 1
  ip netns exec "$NETNS_PREFIX-sw" ip link set br0 up || return 1
  for ((i = 0; i < count; i++)); do
    ns=$(host_ns "$i")
    ip netns add "$ns" || return 1
    ip netns exec "$ns" ip link set lo up || return 1
    ip netns exec "$ns" ip link add eth0 type veth peer name "port$i" netns "$NETNS_PREFIX-sw" || return 1
    ip netns exec "$ns" ip addr add "$(host_addr "$i")/24" dev eth0 || return 1
    ip netns exec "$ns" ip link set eth0 up || return 1
    ip netns exec "$NETNS_PREFIX-sw" ip link set "port$i" master br0 || return 1
    ip netns exec "$NETNS_PREFIX-sw" ip link set "port$i" up || return 1
  done
}

netns_hosts_down() {
  [ -n "$NETNS_PREFIX" ] || return 0
  local ns pids
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$NETNS_PREFIX-"); do
    pids=$(ip netns pids "$ns" 2>/dev/null)
    # shellcheck disable=SC2086
    [ -z "$pids" ] || kill -9 $pids 2>/dev/null
    ip netns del "$ns" 2>/dev/null
  done
}
