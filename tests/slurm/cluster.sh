#!/usr/bin/env bash
# A private single-node SLURM cluster on loopback addresses, for the SLURM smoke test
# (Debian 12: SLURM 22.05.8, munge, slurmdbd + MariaDB so that `sacct` works; the facts it
# rests on are in tests/slurm/NOTES.md). Needs root. Everything lives under DIR, except the link
# /etc/slurm/slurm.conf -> DIR/slurm.conf (job steps read the default path; made only where
# no slurm.conf exists, removed by `down`); daemons are stopped by the PIDs in DIR/pids,
# never by name. Driven by tests/slurm/run_smoke.sh (.ci/run, `make test-slurm`).
#   tests/slurm/cluster.sh up DIR     install the packages if missing, write configs, start
#   tests/slurm/cluster.sh down DIR   cancel jobs, stop the daemons
set -euo pipefail
cmd=${1:?usage: cluster.sh up|down DIR}
D=$(realpath -m "${2:?usage: cluster.sh up|down DIR}")
PIDS=$D/pids
PORT_DB=33307
MUNGE_SOCK=/run/munge/munge.socket.2
PKGS="slurmctld slurmd slurm-client slurm-wlm-basic-plugins munge slurmdbd slurm-wlm-mysql-plugin mariadb-server"

install_packages() {
  dpkg -s $PKGS >/dev/null 2>&1 && return
  # keep the install from starting services (no systemd here)
  local guard=/usr/sbin/policy-rc.d made=0
  [ -e $guard ] || { printf '#!/bin/sh\nexit 101\n' > $guard; chmod +x $guard; made=1; }
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $PKGS \
    || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $PKGS; }
  if [ $made = 1 ]; then rm -f $guard; fi
}

wait_for() {  # wait_for SECONDS COMMAND...: poll until COMMAND succeeds
  local n=$(( $1 * 2 )); shift
  for _ in $(seq "$n"); do "$@" >/dev/null 2>&1 && return 0; sleep 0.5; done
  echo "cluster.sh: timed out waiting for: $*" >&2; "$@" >&2 || true; return 1
}

start_munge() {
  # libmunge clients (sacctmgr's persistent connection to slurmdbd) use the default socket
  # whatever AuthInfo says: munged listens there; key, pid and log stay private
  mkdir -p "$(dirname $MUNGE_SOCK)"
  [ -f $D/munge/munge.key ] || dd if=/dev/urandom of=$D/munge/munge.key bs=1024 count=1 status=none
  chmod 400 $D/munge/munge.key
  munged --key-file=$D/munge/munge.key --socket=$MUNGE_SOCK \
    --pid-file=$PIDS/munged.pid --log-file=$D/log/munged.log --seed-file=$D/munge/seed -f
}

start_mariadb() {  # private datadir and socket, loopback, a non-default port
  [ -d $D/db/mysql ] || mariadb-install-db --no-defaults --datadir=$D/db --user=root \
    --auth-root-authentication-method=normal >$D/log/mariadb-install.log 2>&1
  mariadbd --no-defaults --datadir=$D/db --socket=$D/run/mysql.sock --port=$PORT_DB \
    --bind-address=127.0.0.1 --user=root --pid-file=$PIDS/mariadb.pid \
    --innodb-buffer-pool-size=32M --performance-schema=OFF --skip-name-resolve \
    --log-error=$D/log/mariadb.log >/dev/null 2>&1 &
  wait_for 60 mariadb --no-defaults -S $D/run/mysql.sock -uroot -e 'select 1'
  mariadb --no-defaults -S $D/run/mysql.sock -uroot -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
    CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'; FLUSH PRIVILEGES;"
}

write_configs() {
  cat > $D/slurmdbd.conf <<CONF
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCK
DbdAddr=127.0.0.1
DbdHost=localhost
SlurmUser=root
PidFile=$PIDS/slurmdbd.pid
LogFile=$D/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$PORT_DB
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
CONF
  chmod 600 $D/slurmdbd.conf
  local cpus mem
  cpus=$(nproc)
  mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 2048 ))
  cat > $D/slurm.conf <<CONF
ClusterName=flexigpt
SlurmctldHost=localhost(127.0.0.1)
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCK
SlurmUser=root
SlurmctldPidFile=$PIDS/slurmctld.pid
SlurmdPidFile=$PIDS/slurmd.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd.log
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
MinJobAge=600
MailProg=/bin/true
DefMemPerCPU=2000
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
JobAcctGatherType=jobacct_gather/none
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
CONF
  echo "export SLURM_CONF=$D/slurm.conf" > $D/env.sh
}

up() {
  install_packages
  mkdir -p $D/{pids,log,state,spool,munge,db,run}
  start_munge
  start_mariadb
  write_configs
  # job steps (the jobstep plugin's srun inside a job) read the default config path, not the
  # submitting shell's $SLURM_CONF ("Could not establish a configuration source")
  mkdir -p /etc/slurm
  [ -e /etc/slurm/slurm.conf ] || ln -s $D/slurm.conf /etc/slurm/slurm.conf
  . $D/env.sh
  slurmdbd  # reads slurmdbd.conf beside $SLURM_CONF
  wait_for 15 sacctmgr -n show cluster
  sacctmgr -i add cluster flexigpt >/dev/null || true
  sacctmgr -i add account ci Cluster=flexigpt >/dev/null || true
  sacctmgr -i add user root Account=ci >/dev/null || true
  slurmctld -f $D/slurm.conf
  slurmd -f $D/slurm.conf
  wait_for 60 sh -c "sinfo -h -o %T | grep -q idle"
  sinfo
}

down() {
  if [ -f $D/env.sh ]; then . $D/env.sh; scancel --user=root 2>/dev/null || true; fi
  for name in slurmd slurmctld slurmdbd mariadb munged; do
    local f=$PIDS/$name.pid pid
    [ -f $f ] || continue
    pid=$(cat $f)
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f $f
  done
  if [ "$(readlink /etc/slurm/slurm.conf 2>/dev/null)" = "$D/slurm.conf" ]; then
    rm -f /etc/slurm/slurm.conf
  fi
}

case $cmd in
  up) up ;;
  down) down ;;
  *) echo "usage: cluster.sh up|down DIR" >&2; exit 2 ;;
esac
