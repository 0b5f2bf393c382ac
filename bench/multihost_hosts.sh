#!/usr/bin/env bash
# Namespace hosts with throttled links for bench/multihost: the hosts of
# tests/multinode/netns_hosts.sh (one veth "cable" each into a bridge in the
# switch namespace), with a token-bucket filter (tc tbf; netem is not
# available everywhere) on both ends of every cable: the host's eth0 limits
# what the host sends, the switch's portN what it receives. Each cable is
# then a full-duplex link of RATE each way; traffic between processes of one
# host stays on that host (its own address routes over loopback), as on real
# machines.
#
#   bench/multihost_hosts.sh usable               # prints why not and fails: not root, no namespaces, no tc
#   bench/multihost_hosts.sh up 2                 # hosts lsbench-h0 (10.213.0.1), lsbench-h1 (10.213.0.2)
#   bench/multihost_hosts.sh throttle 1gbit       # tbf on every cable end ("none": unthrottled)
#   bench/multihost_hosts.sh measure 1.5          # each host sends to the other for 1.5 s, both at once;
#                                                 # prints "h0->h1 0.95 h1->h0 0.95" (Gbit/s of TCP payload)
#   bench/multihost_hosts.sh job NPROC PORT TIMEOUT_S lockstep|pytorch ARGS...
#                                                 # one job on both hosts: `lockstep run` / torchrun with
#                                                 # --nnodes 2 --nproc-per-node NPROC, master host 0:PORT;
#                                                 # prints host 0's log then host 1's; fails if a node fails
#   bench/multihost_hosts.sh stop                 # kills whatever still runs on the hosts
#   bench/multihost_hosts.sh down                 # kills what runs on the hosts, removes the namespaces
#
# Or source it (functions mh_*). MH_PREFIX (default lsbench) names the
# namespaces; LOCKSTEP (the launcher) and PYTHON (default /usr/bin/python3)
# are used by `job`. Every command run on a host is bounded by `timeout`.
here_mh=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=../tests/multinode/netns_hosts.sh
source "$here_mh/../tests/multinode/netns_hosts.sh"
NETNS_PREFIX=${MH_PREFIX:-lsbench}
MH_HOSTS=2
PYTHON=${PYTHON:-/usr/bin/python3}

mh_usable() {
  netns_hosts_usable || return 1
  if ! command -v tc >/dev/null 2>&1; then
    echo "no 'tc' command (Debian package iproute2)"
    return 1
  fi
  if ! command -v timeout >/dev/null 2>&1; then
    echo "no 'timeout' command (coreutils)"
    return 1
  fi
}

mh_up() {
  MH_HOSTS=${1:-2}
  netns_hosts_up "$NETNS_PREFIX" "$MH_HOSTS" || return 1
  # tbf must work here (it needs the sch_tbf module): try it on host 0 once.
  if ! on_host 0 timeout 10 tc qdisc replace dev eth0 root tbf rate 1gbit burst 128kb latency 10ms; then
    echo "cannot add a tbf qdisc (tc qdisc ... tbf failed: no sch_tbf in this kernel?)"
    return 1
  fi
  on_host 0 timeout 10 tc qdisc del dev eth0 root
}

# Bits per second of a tc rate ("1gbit", "10gbit", "500mbit", "100kbit").
mh_rate_bits() {
  local rate=${1,,} number unit
  number=${rate%%[a-z]*}
  unit=${rate#"$number"}
  case "$unit" in
    gbit) echo $((number * 1000000000)) ;;
    mbit) echo $((number * 1000000)) ;;
    kbit) echo $((number * 1000)) ;;
    bit | "") echo "$number" ;;
    *) return 1 ;;
  esac
}

# tbf RATE on every cable end; "none" removes it. The bucket holds 1 ms of
# traffic (at least 128 KiB: larger than one 64 KiB GSO segment, so big
# segments pass whole), the queue 10 ms (a switch port's buffer; TCP keeps
# it from overflowing).
mh_throttle() {
  local rate=$1 i bits burst ns dev
  local ends=()
  for ((i = 0; i < MH_HOSTS; i++)); do ends+=("$(host_ns "$i") eth0" "$NETNS_PREFIX-sw port$i"); done
  if [ "$rate" = none ]; then
    for ((i = 0; i < ${#ends[@]}; i++)); do
      read -r ns dev <<<"${ends[$i]}"
      ip netns exec "$ns" timeout 10 tc qdisc del dev "$dev" root 2>/dev/null
    done
    return 0
  fi
  bits=$(mh_rate_bits "$rate") || { echo "bad rate '$rate' (e.g. 1gbit, 500mbit)"; return 1; }
  burst=$((bits / 8 / 1000))
  [ "$burst" -ge 131072 ] || burst=131072
  for ((i = 0; i < ${#ends[@]}; i++)); do
    read -r ns dev <<<"${ends[$i]}"
    ip netns exec "$ns" timeout 10 tc qdisc replace dev "$dev" root tbf rate "$rate" burst "$burst" latency 10ms ||
      return 1
  done
}

# The rate the links give TCP: host 0 and host 1 send to each other for
# SECONDS at the same time (both directions of the cable loaded, as in an
# all-reduce ring). Prints "h0->h1 G h1->h0 G" in Gbit/s of payload.
mh_measure() {
  local seconds=${1:-1.5} out
  out=$(mktemp -d /tmp/lsbench-rate.XXXXXX)
  cat >"$out/rate.py" <<'PY'
import socket, sys, time
if sys.argv[1] == "receive":
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((sys.argv[2], int(sys.argv[3])))
    server.listen(1)
    print("listening", flush=True)
    conn, _ = server.accept()
    total, start = 0, None
    while True:
        data = conn.recv(1 << 20)
        if not data:
            break
        if start is None:
            start = time.perf_counter()
        total += len(data)
    print("%.3f" % (total * 8 / (time.perf_counter() - start) / 1e9))
else:
    deadline = None
    for attempt in range(100):
        try:
            conn = socket.create_connection((sys.argv[2], int(sys.argv[3])))
            break
        except OSError:
            time.sleep(0.05)
    block = b"\0" * (1 << 20)
    deadline = time.perf_counter() + float(sys.argv[4])
    while time.perf_counter() < deadline:
        conn.sendall(block)
    conn.close()
PY
  local t=$((${seconds%.*} + 20))
  on_host 1 timeout "$t" "$PYTHON" "$out/rate.py" receive "$(host_addr 1)" 5101 >"$out/to1" 2>&1 &
  local r1=$!
  on_host 0 timeout "$t" "$PYTHON" "$out/rate.py" receive "$(host_addr 0)" 5100 >"$out/to0" 2>&1 &
  local r0=$!
  on_host 0 timeout "$t" "$PYTHON" "$out/rate.py" send "$(host_addr 1)" 5101 "$seconds" &
  local s0=$!
  on_host 1 timeout "$t" "$PYTHON" "$out/rate.py" send "$(host_addr 0)" 5100 "$seconds" &
  local s1=$!
  wait "$s0" "$s1" "$r0" "$r1"
  echo "h0->h1 $(tail -n 1 "$out/to1") h1->h0 $(tail -n 1 "$out/to0")"
  rm -rf "$out"
}

# job NPROC PORT TIMEOUT_S lockstep|pytorch ARGS...: ARGS is the worker
# command (after `lockstep run ... --`) or the python script and its
# arguments (after torchrun's options). Both nodes pin Gloo to eth0.
mh_job() {
  local nproc=$1 port=$2 limit=$3 kind=$4 node pids=() code=0
  shift 4
  local logs
  logs=$(mktemp -d /tmp/lsbench-job.XXXXXX)
  for ((node = 0; node < MH_HOSTS; node++)); do
    if [ "$kind" = lockstep ]; then
      on_host "$node" timeout -k 5 "$limit" "${LOCKSTEP:?set LOCKSTEP to build/bin/lockstep}" run \
        --nnodes "$MH_HOSTS" --node-rank "$node" --nproc-per-node "$nproc" --master-addr "$(host_addr 0)" \
        --master-port "$port" --socket-ifname eth0 -- "$@" >"$logs/host$node.log" 2>&1 &
    else
      # Debian's torchrun 1.13 on Python 3.11 fails with the default
      # redirects; tee'd stdout is what the bench parses anyway.
      on_host "$node" env GLOO_SOCKET_IFNAME=eth0 OMP_NUM_THREADS=1 timeout -k 5 "$limit" "$PYTHON" \
        -m torch.distributed.run --nnodes "$MH_HOSTS" --node_rank "$node" --nproc_per_node "$nproc" \
        --master_addr "$(host_addr 0)" --master_port "$port" --redirects 1 --tee 1 "$@" \
        >"$logs/host$node.log" 2>&1 &
    fi
    pids+=($!)
  done
  for ((node = 0; node < MH_HOSTS; node++)); do
    wait "${pids[$node]}" || { code=$?; echo "host $node's launcher exited with $code"; }
  done
  # Read before printing: the temporary directory goes even when nobody
  # reads the output any more (the bench was interrupted).
  local output=""
  for ((node = 0; node < MH_HOSTS; node++)); do
    output+="----- host $node"$'\n'"$(cat "$logs/host$node.log")"$'\n'
  done
  rm -rf "$logs"
  printf '%s' "$output"
  return "$code"
}

# Kills whatever still runs on the hosts (after a failed or timed-out job).
mh_stop() {
  local i pids
  for ((i = 0; i < MH_HOSTS; i++)); do
    pids=$(host_pids "$i")
    # shellcheck disable=SC2086
    [ -z "$pids" ] || kill -9 $pids 2>/dev/null
  done
  return 0
}

mh_down() { netns_hosts_down; }

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  command=${1:?usage: multihost_hosts.sh usable|up|throttle|measure|job|stop|down ...}
  shift
  case "$command" in
    usable) mh_usable ;;
    up) mh_up "$@" ;;
    throttle) mh_throttle "$@" ;;
    measure) mh_measure "$@" ;;
    job) mh_job "$@" ;;
    stop) mh_stop ;;
    down) mh_down ;;
    *)
      echo "unknown command '$command'"
      exit 2
      ;;
  esac
fi
