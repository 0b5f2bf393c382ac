# A SLURM cluster of the project's own, on the namespace hosts of
# netns_hosts.sh: Debian's slurm-wlm 22.05 and munge, started as root with
# their files under one directory. slurmctld runs on host 0 and one slurmd on
# every host, each under the host's own name; nothing of the machine's own
# SLURM (/etc/slurm, systemd units) is read or touched.
#
#   source tests/multinode/netns_hosts.sh
#   source tests/multinode/slurm_cluster.sh
#   slurm_cluster_usable || exit 77        # prints why not (no slurmctld, ...)
#   netns_hosts_up lsmn-slurm 2
#   slurm_cluster_up "$work/slurm" 2       # exports SLURM_CONF, waits for the nodes
#   on_slurm_host 0 srun --nodes 2 --ntasks-per-node 2 hostname
#   slurm_cluster_down                     # before netns_hosts_down
#
# Note [A SLURM cluster in network namespaces]:
#   - Commands run on a host through on_slurm_host, which enters only the
#     host's network namespace (nsenter) plus a mount and UTS namespace of
#     their own, where the host's name is set and a hosts file naming every
#     host is bound over /etc/hosts. Not `ip netns exec`: it mounts a fresh
#     /sys, which has no /sys/fs/cgroup, and slurmd 22.05 refuses to start
#     without one (even with proctrack/linuxproc and task/none).
#   - slurmctld checks that its host's name is SlurmctldHost; the slurmd find
#     their NodeName the same way. Jobs see these names in SLURM_NODELIST and
#     resolve them through the bound hosts file, as on a real cluster.
#   - One munged in the machine's namespace serves every host: munge speaks
#     over a Unix socket, and the hosts share the filesystem (real clusters
#     run one munged per node with the same key).
#   - AuthInfo's cred_expire is 5 s instead of 120 s: SLURM holds a requeued
#     job back until the credentials of its last run expire.

SLURM_CLUSTER_DIR=""
SLURM_CLUSTER_HOSTS=0

slurm_cluster_usable() {
  local tool
  for tool in slurmctld slurmd sbatch srun scontrol squeue; do
    if ! command -v "$tool" >/dev/null 2>&1; then
      echo "no '$tool' (Debian packages slurm-wlm and munge; scripts/install-deps.sh installs them)"
      return 1
    fi
  done
  if ! command -v munged >/dev/null 2>&1; then
    echo "no 'munged' (Debian package munge)"
    return 1
  fi
  if ! command -v nsenter >/dev/null 2>&1 || ! command -v unshare >/dev/null 2>&1; then
    echo "no nsenter/unshare (Debian package util-linux)"
    return 1
  fi
  if [ ! -d /sys/fs/cgroup ] || [ -z "$(ls -A /sys/fs/cgroup 2>/dev/null)" ]; then
    echo "no cgroup file system at /sys/fs/cgroup: slurmd 22.05 cannot start without one"
    return 1
  fi
}

# on_slurm_host HOST COMMAND...: COMMAND on namespace host HOST, under the
# host's name and with the cluster's hosts file.
on_slurm_host() {
  local host=$1
  shift
  nsenter --net="/run/netns/$(host_ns "$host")" unshare --mount --uts \
    sh -c 'mount --bind "$0" /etc/hosts && hostname "$1" && shift && exec "$@"' \
    "$SLURM_CLUSTER_DIR/hosts" "$(host_ns "$host")" "$@"
}

# slurm_cluster_up DIR HOSTS: munged, slurmctld on host 0, a slurmd on each of
# the first HOSTS hosts; returns once every node is idle (non-zero after 30 s).
slurm_cluster_up() {
  SLURM_CLUSTER_DIR=$1
  SLURM_CLUSTER_HOSTS=$2
  local d=$SLURM_CLUSTER_DIR i name nodes=""
  mkdir -p "$d/state" || return 1
  {
    echo "127.0.0.1 localhost"
    for ((i = 0; i < SLURM_CLUSTER_HOSTS; i++)); do echo "$(host_addr "$i") $(host_ns "$i")"; done
  } >"$d/hosts"
  head -c 1024 /dev/urandom >"$d/munge.key" && chmod 400 "$d/munge.key" || return 1
  munged --force --socket="$d/munge.socket" --key-file="$d/munge.key" --pid-file="$d/munged.pid" \
    --log-file="$d/munged.log" --seed-file="$d/munged.seed" || return 1
  for ((i = 0; i < SLURM_CLUSTER_HOSTS; i++)); do
    name=$(host_ns "$i")
    mkdir -p "$d/spool/$name"
    nodes+="NodeName=$name NodeAddr=$(host_addr "$i") CPUs=$(nproc) State=UNKNOWN"$'\n'
  done
  cat >"$d/slurm.conf" <<CONF
ClusterName=lockstep-test
SlurmctldHost=$(host_ns 0)($(host_addr 0))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$d/munge.socket,cred_expire=5
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$d/state
SlurmdSpoolDir=$d/spool/%n
SlurmctldPidFile=$d/slurmctld.pid
SlurmdPidFile=$d/slurmd.%n.pid
SlurmctldLogFile=$d/slurmctld.log
SlurmdLogFile=$d/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
JobRequeue=1
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
KillWait=30
${nodes}PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
  # Under cgroup v2, slurmd makes its own cgroup instead of asking systemd.
  echo "IgnoreSystemd=yes" >"$d/cgroup.conf"
  export SLURM_CONF="$d/slurm.conf"
  on_slurm_host 0 slurmctld -i -f "$SLURM_CONF" || return 1
  for ((i = 0; i < SLURM_CLUSTER_HOSTS; i++)); do
    on_slurm_host "$i" slurmd -f "$SLURM_CONF" || return 1
  done
  local tries states
  for ((tries = 0; tries < 300; tries++)); do
    states=$(on_slurm_host 0 sinfo -h -N -o %T 2>/dev/null | sort -u)
    [ "$states" = idle ] && return 0
    sleep 0.1
  done
  echo "slurm_cluster_up: the nodes are not idle after 30 s (sinfo: ${states:-nothing})" >&2
  return 1
}

# slurm_cluster_logs: the last lines of every daemon's log (for failures).
slurm_cluster_logs() {
  local log
  for log in "$SLURM_CLUSTER_DIR"/slurmctld.log "$SLURM_CLUSTER_DIR"/slurmd.*.log; do
    [ -f "$log" ] || continue
    echo "----- $(basename "$log") (last 15 lines)"
    tail -n 15 "$log"
  done
}

slurm_cluster_down() {
  [ -n "$SLURM_CLUSTER_DIR" ] || return 0
  local pidfile
  for pidfile in "$SLURM_CLUSTER_DIR"/slurmctld.pid "$SLURM_CLUSTER_DIR"/slurmd.*.pid "$SLURM_CLUSTER_DIR"/munged.pid; do
    [ -f "$pidfile" ] && kill -9 "$(cat "$pidfile")" 2>/dev/null
  done
  SLURM_CLUSTER_DIR=""
  return 0
}
