#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, for `distill grid --executor slurm` and its tests.
#
#   scripts/slurm-local.sh install   Debian's slurm-wlm and munge (apt-get; root)
#   scripts/slurm-local.sh start     install if needed, then munged + slurmctld + slurmd (idempotent)
#   scripts/slurm-local.sh stop      stop them and remove everything start wrote (idempotent)
#   scripts/slurm-local.sh status    up or down, and the node
#
# Everything lives under $DISTILL_SLURM_DIR (default /tmp/distill-slurm): a munge key made here,
# the daemons' state, logs and pid files. The configuration goes to /etc/slurm/slurm.conf, where
# every SLURM command finds it, and only when no other configuration is there (a real cluster's
# is never touched). The daemons run as root: proctrack/linuxproc and task/none need no cgroups,
# select/cons_tres hands out the node's CPUs and memory. No accounting database: `sacct` answers
# nothing here, and slurmctld keeps finished jobs for MinJobAge (a day) for `squeue` instead.
set -euo pipefail

DIR=${DISTILL_SLURM_DIR:-/tmp/distill-slurm}
CONF=/etc/slurm/slurm.conf
MARK="# distill one-node test cluster (scripts/slurm-local.sh)"
PARTITION=${DISTILL_SLURM_PARTITION:-debug}

say() { echo "slurm-local: $*"; }

installed() { command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
  && command -v sbatch >/dev/null; }

install() {
  installed && return 0
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    say "cannot install SLURM: needs root and apt-get (Debian's slurm-wlm and munge)"; return 1
  fi
  say "installing slurm-wlm and munge (apt-get)"
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    slurmctld slurmd slurm-client munge >/dev/null
  installed
}

pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

up() { pid_alive "$DIR/munged.pid" && pid_alive "$DIR/slurmctld.pid" && pid_alive "$DIR/slurmd.pid"; }

write_conf() {
  local host cpus mem
  host=$(hostname -s)
  cpus=$(nproc)
  mem=$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)
  mkdir -p /etc/slurm
  cat > "$CONF" <<EOF
$MARK
ClusterName=distill-local
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# cred_expire: also how long a requeued job waits before it may start again (121 s by default).
AuthInfo=socket=$DIR/munge/munge.socket,cred_expire=10
CredType=cred/munge
StateSaveLocation=$DIR/ctld
SlurmdSpoolDir=$DIR/d
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
MpiDefault=none
ReturnToService=2
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MinJobAge=86400
# Job ids go on from where an earlier cluster on this machine left them: a grid folder from before
# a restart never names a new job.
FirstJobId=$(( $(date +%s) % 60000000 ))
# A job that names no memory gets its CPUs' share, not the whole node's (which would serialise them).
DefMemPerCPU=$(( mem / cpus ))
KillWait=10
InactiveLimit=0
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=$PARTITION Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
}

start() {
  install || exit 1
  if [ -f "$CONF" ] && ! grep -qF "$MARK" "$CONF"; then
    say "$CONF is not this script's: a SLURM cluster is configured here already; use it"; exit 1
  fi
  if up && sinfo -h >/dev/null 2>&1; then say "up already ($(sinfo -h -o '%P %D node(s) %C cpus(A/I/O/T)'))"; return 0; fi
  stop quiet
  mkdir -p "$DIR/munge" "$DIR/ctld" "$DIR/d"
  chmod 700 "$DIR/munge"
  dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
  chmod 400 "$DIR/munge/munge.key"
  munged --force --key-file="$DIR/munge/munge.key" --socket="$DIR/munge/munge.socket" \
    --pid-file="$DIR/munged.pid" --log-file="$DIR/munged.log" --seed-file="$DIR/munge/seed"
  write_conf
  slurmctld -c -f "$CONF"
  slurmd -f "$CONF"
  for _ in $(seq 1 60); do
    if sinfo -h -o '%T' 2>/dev/null | grep -qE '^idle'; then
      say "up: partition $PARTITION, node $(hostname -s), $(nproc) cpus ($DIR)"; return 0
    fi
    sleep 0.5
  done
  say "the node did not come up; see $DIR/slurmctld.log and $DIR/slurmd.log"
  stop quiet
  exit 1
}

stop_pid() {  # pid file: TERM, then KILL after 10 s
  local file=$1 pid
  [ -f "$file" ] || return 0
  pid=$(cat "$file")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$file"
}

stop() {
  if [ -f "$CONF" ] && grep -qF "$MARK" "$CONF" && pid_alive "$DIR/slurmctld.pid"; then
    scancel --full --quiet --partition="$PARTITION" 2>/dev/null || true  # no job outlives its cluster
  fi
  stop_pid "$DIR/slurmd.pid"
  stop_pid "$DIR/slurmctld.pid"
  stop_pid "$DIR/munged.pid"
  # Job steps whose slurmstepd outlived slurmd (the jobs' processes hang under it).
  pkill_steps
  if [ -f "$CONF" ] && grep -qF "$MARK" "$CONF"; then rm -f "$CONF"; fi
  rm -rf "$DIR"
  [ "${1:-}" = quiet ] || say "stopped; nothing left in $DIR or $CONF"
}

pkill_steps() {
  local pid
  for pid in $(pgrep -x slurmstepd 2>/dev/null || true); do
    # Only the steps of this cluster: their spool directory is under $DIR.
    if tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -q . && ls -l "/proc/$pid/cwd" 2>/dev/null | grep -qF "$DIR"; then
      kill -9 "$pid" 2>/dev/null || true
    fi
  done
}

case "${1:-}" in
  install) install ;;
  start) start ;;
  stop) stop ;;
  status) if up; then say "up"; sinfo; else say "down"; exit 1; fi ;;
  *) echo "usage: $0 install|start|stop|status" >&2; exit 2 ;;
esac
