#!/usr/bin/env bash
# A one-node Slurm cluster for the tests, in a directory of its own: munged with its own key and
# socket, slurmctld and slurmd on 127.0.0.1 with their own ports, state and logs. Nothing of the
# machine's Slurm or munge configuration is used or changed.
#   source test/slurm/cluster.sh; slurm_start DIR; ...srun/sbatch/scancel...; slurm_stop
# slurm_start exports SLURM_CONF; it returns 77 (skip) where a cluster cannot run here (not
# root, Slurm or munge not installed) and 1 when the daemons do not come up.
slurm_start() {
  SLURM_DIR="$1"
  [ "$(id -u)" -eq 0 ] || { echo "skip: the Slurm test starts munged, slurmctld and slurmd, which needs root"; return 77; }
  for bin in munged slurmctld slurmd srun sbatch scancel scontrol sinfo; do
    command -v "$bin" >/dev/null || { echo "skip: $bin is not installed (scripts/setup.sh --test installs slurm-wlm and munge)"; return 77; }
  done
  mkdir -p "$SLURM_DIR"/{state,spool,munge}
  chmod 700 "$SLURM_DIR/munge"
  dd if=/dev/urandom of="$SLURM_DIR/munge/munge.key" bs=1024 count=1 status=none
  chmod 400 "$SLURM_DIR/munge/munge.key"
  munged --force --socket="$SLURM_DIR/munge/munge.socket" --key-file="$SLURM_DIR/munge/munge.key" \
    --pid-file="$SLURM_DIR/munge/munged.pid" --log-file="$SLURM_DIR/munge/munged.log" --seed-file="$SLURM_DIR/munge/munged.seed" ||
    { echo "munged did not start"; return 1; }
  local host cpus port
  host=$(hostname -s)
  cpus=$(nproc)
  port=$((16000 + RANDOM % 20000))
  : > "$SLURM_DIR/plugstack.conf"
  cat > "$SLURM_DIR/slurm.conf" <<CONF
ClusterName=dstrain-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
AuthType=auth/munge
AuthInfo=socket=$SLURM_DIR/munge/munge.socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$SLURM_DIR/state
SlurmdSpoolDir=$SLURM_DIR/spool
SlurmctldPidFile=$SLURM_DIR/slurmctld.pid
SlurmdPidFile=$SLURM_DIR/slurmd.pid
SlurmctldLogFile=$SLURM_DIR/slurmctld.log
SlurmdLogFile=$SLURM_DIR/slurmd.log
PlugStackConfig=$SLURM_DIR/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
KillWait=10
MinJobAge=60
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
  export SLURM_CONF="$SLURM_DIR/slurm.conf"
  slurmctld -f "$SLURM_CONF" -i || { echo "slurmctld did not start"; cat "$SLURM_DIR/slurmctld.log"; return 1; }
  slurmd -f "$SLURM_CONF" || { echo "slurmd did not start"; cat "$SLURM_DIR/slurmd.log"; return 1; }
  for _ in $(seq 1 100); do
    if sinfo -h -o %t 2>/dev/null | grep -qE '^idle'; then return 0; fi
    sleep 0.2
  done
  echo "the Slurm node did not become idle:"; sinfo 2>&1; tail -20 "$SLURM_DIR/slurmctld.log" "$SLURM_DIR/slurmd.log"
  return 1
}

slurm_stop() {
  [ -n "${SLURM_DIR:-}" ] || return 0
  scancel --full --signal=KILL --user="$(id -un)" 2>/dev/null || true  # no job step outlives the test
  for _ in $(seq 1 25); do squeue -h 2>/dev/null | grep -q . || break; sleep 0.2; done
  for pidfile in slurmd.pid slurmctld.pid munge/munged.pid; do
    [ -f "$SLURM_DIR/$pidfile" ] && kill "$(cat "$SLURM_DIR/$pidfile")" 2>/dev/null || true
  done
  sleep 0.5
  for pidfile in slurmd.pid slurmctld.pid munge/munged.pid; do
    [ -f "$SLURM_DIR/$pidfile" ] && kill -9 "$(cat "$SLURM_DIR/$pidfile")" 2>/dev/null || true
  done
}
