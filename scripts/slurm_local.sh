#!/usr/bin/env bash
# A one-machine Slurm cluster for the `slurm` tests and for trying `tessera submit`: munge,
# MariaDB + slurmdbd (so sacct has accounting), slurmctld and one slurmd on this host, all
# under DIR with their own ports, none touching /etc.
#
#   scripts/slurm_local.sh start DIR   # prints `export SLURM_CONF=DIR/slurm.conf`
#   eval "$(scripts/slurm_local.sh start /tmp/slurm)"; sbatch ...; sacct ...
#   scripts/slurm_local.sh stop DIR
#
# The packages (slurm-wlm, slurmdbd, munge, mariadb-server) come from scripts/install_deps.sh.
# Run it as root: slurmd starts the jobs' tasks as their users.
# Exit code 2: Slurm cannot start here (a package missing, a daemon refused); the log says why.
set -euo pipefail
cmd=${1:-}
dir=${2:-}
if [ -z "$cmd" ] || [ -z "$dir" ]; then
  echo "usage: $0 start|stop DIR" >&2
  exit 64
fi

stop() {
  # The jobs first: with proctrack/linuxproc their steps would outlive slurmd.
  if [ -f "$dir/slurm.conf" ] && [ -f "$dir/slurmctld.pid" ]; then
    SLURM_CONF="$dir/slurm.conf" scancel --full --user="$(id -un)" 2>/dev/null || true
    for _ in $(seq 200); do  # KillWait (10 s) and then some
      [ -z "$(SLURM_CONF="$dir/slurm.conf" squeue -h 2>/dev/null)" ] && break
      sleep 0.1
    done
  fi
  for name in slurmd slurmctld slurmdbd mariadb munged; do
    [ -f "$dir/$name.pid" ] || continue
    pid=$(cat "$dir/$name.pid" 2>/dev/null || true)
    [ -n "$pid" ] && kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$dir/$name.pid"
  done
}

if [ "$cmd" = stop ]; then
  stop
  exit 0
fi
[ "$cmd" = start ] || { echo "usage: $0 start|stop DIR" >&2; exit 64; }

cannot() {
  trap - ERR
  echo "slurm_local: $*" >&2
  stop
  exit 2
}
# Any other failure is a broken script, not "cannot start": exit 1 (the tests fail, not skip).
trap 'echo "slurm_local: line $LINENO failed" >&2; trap - ERR; stop; exit 1' ERR
# slurmd starts each job's tasks as the job's user, which takes root.
[ "$(id -u)" -eq 0 ] || cannot "the daemons need root (slurmd starts the jobs' tasks as their users)"
for tool in munged mariadbd mariadb-install-db slurmdbd slurmctld slurmd sbatch sacct; do
  command -v "$tool" >/dev/null || cannot "$tool is not installed (scripts/install_deps.sh installs it)"
done

mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
# Readable by all (slurm.conf, the munge socket): the jobs' users are its clients.
chmod 755 "$dir"
mkdir -p "$dir/munge" "$dir/db" "$dir/ctld" "$dir/spool" "$dir/log"
chmod 755 "$dir/munge"
user=$(id -un)
host=$(hostname -s)
# Ports of our own: a base from the directory's name so that two clusters on one host differ.
base=$((20000 + $(printf '%s' "$dir" | cksum | cut -d' ' -f1) % 20000))
db_port=$base ctld_port=$((base + 1)) d_port=$((base + 2)) dbd_port=$((base + 3))

# munge: a key of our own and a socket under DIR.
[ -f "$dir/munge/munge.key" ] || { head -c 1024 /dev/urandom > "$dir/munge/munge.key"; }
chmod 400 "$dir/munge/munge.key"
munged --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.sock" \
  --pid-file="$dir/munged.pid" --log-file="$dir/log/munged.log" \
  --seed-file="$dir/munge/munged.seed" 2>>"$dir/log/munged.log" || cannot "munged did not start: $(tail -3 "$dir/log/munged.log")"

# MariaDB for slurmdbd, on 127.0.0.1 and a socket under DIR.
if [ ! -d "$dir/db/mysql" ]; then
  mariadb-install-db --user="$user" --datadir="$dir/db" --auth-root-authentication-method=socket \
    >"$dir/log/mariadb-install.log" 2>&1 || cannot "mariadb-install-db failed: $(tail -3 "$dir/log/mariadb-install.log")"
fi
mariadbd --no-defaults --user="$user" --datadir="$dir/db" --socket="$dir/mysql.sock" \
  --port="$db_port" --bind-address=127.0.0.1 --pid-file="$dir/mariadb.pid" \
  --log-error="$dir/log/mariadb.log" --skip-name-resolve --innodb-buffer-pool-size=64M \
  >/dev/null 2>&1 &
for _ in $(seq 100); do [ -S "$dir/mysql.sock" ] && break; sleep 0.1; done
[ -S "$dir/mysql.sock" ] || cannot "mariadbd did not start: $(tail -3 "$dir/log/mariadb.log")"
mariadb --no-defaults -S "$dir/mysql.sock" -u root -e \
  "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm';
   GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';" ||
  cannot "MariaDB refused the slurm user"

cat > "$dir/slurmdbd.conf" <<EOF
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.sock
DbdHost=localhost
DbdPort=$dbd_port
SlurmUser=$user
PidFile=$dir/slurmdbd.pid
LogFile=$dir/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$db_port
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
EOF
chmod 600 "$dir/slurmdbd.conf"

# One node: this host's CPUs and memory as slurmd sees them.
node=$(slurmd -C 2>/dev/null | head -1 | sed "s/^NodeName=[^ ]*/NodeName=$host/") ||
  cannot "slurmd -C cannot describe this host"
cat > "$dir/slurm.conf" <<EOF
ClusterName=tessera
SlurmctldHost=$host
SlurmUser=$user
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.sock,cred_expire=10
SlurmctldPort=$ctld_port
SlurmdPort=$d_port
StateSaveLocation=$dir/ctld
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=pmix
ReturnToService=2
JobRequeue=1
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=5
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$dbd_port
# the munge socket for the connections to slurmdbd (AuthInfo is for the others)
AccountingStoragePass=$dir/munge/munge.sock
MailProg=/bin/true
KillWait=10
$node State=UNKNOWN
PartitionName=local Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
export SLURM_CONF="$dir/slurm.conf"

slurmdbd || cannot "slurmdbd did not start: $(tail -3 "$dir/log/slurmdbd.log")"
for _ in $(seq 20); do timeout 5 sacctmgr -i show cluster >/dev/null 2>&1 && break; sleep 0.2; done
sacctmgr -i show cluster >/dev/null 2>&1 || cannot "slurmdbd does not answer: $(tail -3 "$dir/log/slurmdbd.log")"
sacctmgr -i show cluster -n format=cluster | grep -w tessera >/dev/null ||
  sacctmgr -i add cluster tessera >/dev/null || cannot "sacctmgr cannot add the cluster"
slurmctld -f "$dir/slurm.conf" || cannot "slurmctld did not start: $(tail -3 "$dir/log/slurmctld.log")"
slurmd -f "$dir/slurm.conf" || cannot "slurmd did not start: $(tail -3 "$dir/log/slurmd.log")"
for _ in $(seq 150); do
  state=$(sinfo -h -N -o %t 2>/dev/null | head -1 || true)
  [ "$state" = idle ] && break
  sleep 0.2
done
[ "$state" = idle ] || cannot "the node is not idle ($state): $(tail -3 "$dir/log/slurmd.log")"
printf 'export SLURM_CONF=%q\n' "$dir/slurm.conf"
