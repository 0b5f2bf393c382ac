# The `etcd` scenario of multinode_test.sh (sourced by it): an elastic job
# whose rendezvous lives on a 3-member etcd cluster, one member per namespace
# host, over TLS with client certificates, as etcd is run in production.
#
#   member  host 0's etcd member is killed mid-epoch: the job does not notice
#           (no second round) and its accuracy is the reference
#   lost0   the host of node 0 (rank 0, the round's store, an etcd member) is
#           cut off and killed for good mid-epoch: the other two train again
#           within 30 s, every sample of the epoch once, accuracy within 1
#           point of the reference
#   lost1   the same with the host of node 1
#   stranger a launcher with a client certificate from another CA is refused
#           with an error that says so
#
# Uses multinode_test.sh's fail, expect_in, on_host, host_addr, host_pids,
# link_down/link_up, wait_for_file, wait_for_text, fmnist_job, elastic_node,
# accuracy, nothing_left_running.

ETCD_PIDS=()

# etcd_member HOST: starts (or restarts, from its data directory) HOST's member.
etcd_member() {
  local host=$1 addr cluster="" h
  addr=$(host_addr "$host")
  for h in 0 1 2; do cluster+="${cluster:+,}h$h=http://$(host_addr "$h"):2380"; done
  on_host "$host" etcd --name "h$host" --data-dir "$work/etcd-h$host" \
    --listen-client-urls "https://$addr:2379" --advertise-client-urls "https://$addr:2379" \
    --listen-peer-urls "http://$addr:2380" --initial-advertise-peer-urls "http://$addr:2380" \
    --initial-cluster "$cluster" --initial-cluster-state new --initial-cluster-token "lockstep-$$" \
    --cert-file "$work/certs/server.pem" --key-file "$work/certs/server.key" \
    --trusted-ca-file "$work/certs/ca.pem" --client-cert-auth >>"$work/etcd-h$host.log" 2>&1 &
  ETCD_PIDS[$host]=$!
}

etcdctl_all() {  # ARGS...: etcdctl against the whole cluster, from host 0... or any live host
  local host=${ETCDCTL_HOST:-0}
  on_host "$host" env ETCDCTL_API=3 etcdctl --endpoints="$ENDPOINTS" --cacert "$work/certs/ca.pem" \
    --cert "$work/certs/client.pem" --key "$work/certs/client.key" --dial-timeout=1s --command-timeout=3s "$@"
}

cluster_healthy() {  # COUNT: that many members answer
  [ "$(etcdctl_all endpoint health 2>&1 | grep -c "is healthy")" -ge "$1" ]
}

# host_of_node LOG_NAME N: the namespace host whose launcher was node N of round 0.
host_of_node() {
  local h
  for h in 0 1 2; do
    grep -q "rendezvous round 0: node $2 of 3" "$work/$1-host$h.log" 2>/dev/null && { echo "$h"; return; }
  done
}

# etcd_run NAME: the three nodes of the job, in the background (pids in NODE_PIDS).
etcd_run() {
  local host
  RDZV=(--rdzv-backend etcd --rdzv-endpoint "$ENDPOINTS" --rdzv-id "$1-$$")
  RDZV_CONF=",lease_ttl=5,protocol=https,cacert=$work/certs/ca.pem,cert=$work/certs/client.pem,key=$work/certs/client.key"
  for host in 0 1 2; do
    elastic_node "$host" "$1" 2:3 "$work/$1" "$slow"
    NODE_PIDS[$host]=$!
  done
}

etcd_scenario() {
  command -v etcd >/dev/null || { echo "SKIP: no etcd (Debian package etcd-server)"; exit 77; }
  command -v openssl >/dev/null || { echo "SKIP: no openssl"; exit 77; }
  "$here/../support/make_test_certs.sh" "$work/certs" "$(host_addr 0)" "$(host_addr 1)" "$(host_addr 2)" ||
    fail "could not make the test certificates"
  ENDPOINTS="$(host_addr 0):2379,$(host_addr 1):2379,$(host_addr 2):2379"
  local host
  for host in 0 1 2; do etcd_member "$host"; done
  wait_until 30 "the 3 etcd members to be healthy" cluster_healthy 3
  fmnist_job
  slow='custom_hooks=[{type: FaultInjection, step_delay_ms: 10}]'

  # member: an etcd member alone dies; the job does not notice.
  etcd_run member
  wait_for_file "$work/member/model_0000149.ckpt" 120
  kill -9 "${ETCD_PIDS[0]}"
  wait "${ETCD_PIDS[0]}" 2>/dev/null
  for host in 0 1 2; do wait "${NODE_PIDS[$host]}" || fail "member: host $host's launcher exited with $?"; done
  cat "$work"/member-host*.log | grep -q "rendezvous round 1" && fail "losing an etcd member started a second round"
  reference=$(accuracy "$work"/member-host*.log)
  [ -n "$reference" ] || fail "member: no final test accuracy"
  echo "etcd member on host 0 killed: one round, test accuracy $reference"
  etcd_member 0
  wait_until 30 "host 0's etcd member to be back" cluster_healthy 3

  # lost0, lost1: the host of node N dies for good (cut off, then everything on it killed).
  local node lost survivors killed acc
  for node in 0 1; do
    etcd_run "lost$node"
    wait_for_file "$work/lost$node/model_0000149.ckpt" 120
    lost=$(host_of_node "lost$node" "$node")
    [ -n "$lost" ] || fail "lost$node: no host says it is node $node of round 0"
    link_down "$lost"
    # shellcheck disable=SC2046
    kill -9 $(host_pids "$lost")
    killed=$SECONDS
    survivors=()
    for host in 0 1 2; do [ "$host" = "$lost" ] || survivors+=("$host"); done
    for host in "${survivors[@]}"; do
      wait_for_text "$work/lost$node-host$host.log" "rendezvous round 1: node" 30
    done
    echo "lost$node: host $lost (node $node) killed; the other two went on in round 1 $((SECONDS - killed)) s later"
    for host in "${survivors[@]}"; do
      wait "${NODE_PIDS[$host]}" || fail "lost$node: host $host's launcher exited with $?"
      expect_in "$work/lost$node-host$host.log" "of 2 (ranks"
    done
    wait "${NODE_PIDS[$lost]}" 2>/dev/null
    expect_in "$work/lost$node/log.txt" "saved by 3 rank(s) with batch_size 50, now 2 with batch_size 50"
    python3 "$here/check_index_log.py" 0 60000 "$work/lost$node"/index_rank*.log ||
      fail "lost$node: the interrupted epoch's samples"
    acc=$(accuracy "$work"/lost$node-host*.log)
    [ -n "$acc" ] || fail "lost$node: no final test accuracy"
    echo "lost$node: test accuracy $acc (reference $reference)"
    python3 -c "import sys; sys.exit(abs($reference - $acc) > 0.01)" ||
      fail "lost$node: test accuracy $acc is more than 1 point from the reference $reference"
    # The host comes back (a new machine in its place) with its etcd member.
    link_up "$lost"
    etcd_member "$lost"
    ETCDCTL_HOST=${survivors[0]} wait_until 60 "host $lost's etcd member to be back" cluster_healthy 3
  done

  # stranger: a client certificate the cluster does not trust.
  on_host 1 timeout 60 "$lockstep" run --rdzv-backend etcd --rdzv-endpoint "$ENDPOINTS" --rdzv-id stranger-$$ \
    --nnodes 2:3 --rdzv-conf "protocol=https,cacert=$work/certs/ca.pem,cert=$work/certs/stranger.pem,key=$work/certs/stranger.key" \
    -- true >"$work/stranger.log" 2>&1 && fail "a launcher with an untrusted client certificate was let in"
  expect_in "$work/stranger.log" "cannot reach etcd at any of its endpoints: https://$(host_addr 0):2379"
  expect_in "$work/stranger.log" "is this client's certificate ($work/certs/stranger.pem) signed by a CA the cluster trusts"
  nothing_left_running_but_etcd
}

# Everything the job started has ended (the etcd members are the test's own).
nothing_left_running_but_etcd() {
  local host pids pid
  for host in 0 1 2; do
    for pid in $(host_pids "$host"); do
      [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = etcd ] && continue
      fail "left running on host $host: $(ps -o pid=,args= -p "$pid")"
    done
  done
}
