#!/usr/bin/env bash
# A highly available Postgres for railguard's collector, on loopback: one etcd member, three
# PostgreSQL 15 members under Patroni with synchronous replication (an acknowledged COMMIT is on
# the primary and a synchronous standby), and HAProxy routing a read-write port to the primary
# and a read-only port to the replicas by Patroni's REST health checks.
#
#   scripts/pg-ha.sh up DIR      start everything under DIR; prints write_url=…, read_url=… (the
#                                collector's own role, no password in them, verified TLS) and
#                                password_file=…
#                                (all or nothing: when it fails, what it started is stopped)
#   scripts/pg-ha.sh status DIR  prints leader=<member> pid=<its postmaster's pid>
#   scripts/pg-ha.sh switchover DIR   a planned switchover (patronictl) to a synchronous standby
#   scripts/pg-ha.sh backup DIR  a full pgBackRest backup of the primary into DIR/backup
#   scripts/pg-ha.sh archive DIR switches the primary's WAL and waits until it is in DIR/backup
#   scripts/pg-ha.sh restore DIR TO [TIME]
#                                restores the newest backup and the archived WAL up to TIME
#                                (any form Postgres reads, e.g. 2026-12-04 10:00:00+00; default:
#                                all of it) into TO/data, starts it as a lone server and prints
#                                restored_url=… and password_file=…
#   scripts/pg-ha.sh down DIR    stops everything it started
#
# Every member archives its WAL with pgBackRest (archive_command, stanza "railguard") into the
# repository DIR/backup, so a backup plus the archive restores to any point after the backup.
#
# Ports: PGHA_PORT_BASE (default 25400) + 0/1 etcd, +10..12 Postgres, +20..22 Patroni REST,
# +30 read-write, +31 read-only, +40 a restored server. The passwords are generated into
# DIR/secrets (0600) and never put in an argument (argv is readable by every local user): the
# collector's role (railguard_collector, owner of the database, pg_monitor; not the superuser),
# Patroni's REST API (its unsafe endpoints take basic auth; patronictl reads it from the member's
# config), etcd (authentication on; Patroni logs in as its root user), the superuser and the
# replication user. etcd (client and peer ports) and Patroni's REST API speak HTTPS only, with
# certificates of the cluster's CA (DIR/tls); etcd's peers must present one; HAProxy checks
# the members' health over verified HTTPS. Run as root, Postgres runs as RAILGUARD_PG_USER (default railguard-pg, made by scripts/setup.sh).
# Every TCP connection to Postgres is TLS (non-TLS ones are rejected), with a server
# certificate for 127.0.0.1 from a CA of the cluster's own (DIR/tls/ca.crt): the URLs printed ask
# for sslmode=verify-full against it.
# The same layout for real hosts: docs/ha-postgres.md.
set -euo pipefail

cmd=${1:-}
dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || { echo "usage: $0 up|status|switchover|backup|archive|restore|down DIR" >&2; exit 2; }
base=${PGHA_PORT_BASE:-25400}
pg_user=${RAILGUARD_PG_USER:-railguard-pg}
bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
members=(pg0 pg1 pg2)

# As the Postgres user, in this process (exec, no fork): the pid recorded is the program's own.
as_pg() {
  if [ "$(id -u)" = 0 ]; then
    exec setpriv --reuid="$pg_user" --regid="$pg_user" --init-groups env HOME="$dir" "$@"
  else
    exec "$@"
  fi
}

status() {
  # Any member's REST API knows the cluster; the first that answers names the leader (none for
  # a moment while a new one is elected).
  local leader
  leader=$(member_in_role leader 20)
  [ -n "$leader" ] || { echo "pg-ha: no leader" >&2; return 1; }
  echo "leader=$leader pid=$(head -1 "$dir/$leader/data/postmaster.pid" 2>/dev/null || echo none)"
}

cluster_json() { # the cluster as the first member that answers sees it
  local i
  for i in 0 1 2; do tls_curl -fsS "https://127.0.0.1:$((base + 20 + i))/cluster" 2>/dev/null && return 0; done
  return 1
}

# The member in ROLE (leader; sync_standby, when running or streaming), asked up to TRIES
# times a quarter second apart; empty when none is.
member_in_role() { # ROLE TRIES
  local name="" _
  for _ in $(seq 1 "$2"); do
    name=$(cluster_json | python3 -c 'import json,sys; print(next((m["name"] for m in json.load(sys.stdin)["members"] if m["role"] == sys.argv[1] and (m["role"] == "leader" or m["state"] in ("running", "streaming"))), ""))' "$1" 2>/dev/null || true)
    [ -n "$name" ] && break
    sleep 0.25
  done
  echo "$name"
}

leader_name() { status | sed -n 's/^leader=\([^ ]*\) .*/\1/p'; }

# pgBackRest as the Postgres user, with the superuser's password for its connections.
backrest() { # config, then pgbackrest's arguments
  local conf=$1
  shift
  (PGPASSWORD=$(cat "$dir/secrets/superuser") as_pg pgbackrest --config="$conf" --stanza=railguard "$@")
}

backrest_conf() { # member or restore directory, pg path, port → DIR/…/pgbackrest.conf
  cat >"$1/pgbackrest.conf" <<CONF
[global]
repo1-path=$dir/backup
repo1-retention-full=2
log-path=$1/pgbackrest
lock-path=$1/pgbackrest
spool-path=$1/pgbackrest
log-level-console=warn
log-level-file=info
start-fast=y
archive-timeout=60

[railguard]
pg1-path=$2
pg1-port=$3
pg1-socket-path=$1
pg1-user=railguard
CONF
  mkdir -p "$1/pgbackrest"
  [ "$(id -u)" = 0 ] && chown -R "$pg_user:" "$1/pgbackrest" "$1/pgbackrest.conf"
  return 0
}

switchover() {
  local leader candidate
  leader=$(leader_name)
  [ -n "$leader" ] || { echo "pg-ha: no leader" >&2; return 1; }
  # The synchronous standby has every acknowledged commit: it is the one to hand over to (after
  # a failover, wait until Patroni has named one again).
  candidate=$(member_in_role sync_standby 240)
  [ -n "$candidate" ] || { echo "pg-ha: no synchronous standby to switch over to" >&2; return 1; }
  patronictl -c "$dir/$leader/patroni.yml" switchover --leader "$leader" --candidate "$candidate" --force >"$dir/logs/switchover.log" 2>&1 ||
    { cat "$dir/logs/switchover.log" >&2; return 1; }
  for _ in $(seq 1 120); do
    [ "$(leader_name 2>/dev/null)" = "$candidate" ] && { echo "leader=$candidate previous=$leader"; return 0; }
    sleep 0.25
  done
  echo "pg-ha: $candidate did not take over" >&2
  return 1
}

backup() {
  local leader
  leader=$(leader_name)
  [ -n "$leader" ] || { echo "pg-ha: no leader" >&2; return 1; }
  backrest "$dir/$leader/pgbackrest.conf" --type=full backup
  backrest "$dir/$leader/pgbackrest.conf" info --output=json >"$dir/logs/backup-info.json"
  echo "backup=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[0]["backup"][-1]["label"])' "$dir/logs/backup-info.json")"
}

archive() {
  local leader
  leader=$(leader_name)
  [ -n "$leader" ] || { echo "pg-ha: no leader" >&2; return 1; }
  backrest "$dir/$leader/pgbackrest.conf" check
}

restore() {
  local to=$1 target=${2:-} su port=$((base + 40))
  [ -n "$to" ] || { echo "usage: $0 restore DIR TO [TIME]" >&2; exit 2; }
  [ ! -e "$to/data" ] || { echo "pg-ha: $to/data exists; restore into an empty directory" >&2; return 1; }
  mkdir -p "$to" "$dir/pids"
  to=$(cd "$to" && pwd)
  chmod 700 "$to"
  [ "$(id -u)" = 0 ] && chown "$pg_user:" "$to"
  su=$(cat "$dir/secrets/superuser")
  backrest_conf "$to" "$to/data" "$port"
  if [ -n "$target" ]; then
    backrest "$to/pgbackrest.conf" --type=time "--target=$target" --target-action=promote restore
  else
    backrest "$to/pgbackrest.conf" restore
  fi
  # The member's settings came with the files: this server stands alone, on its own port, and
  # archives nothing into the cluster's repository.
  (as_pg "$bindir/postgres" -D "$to/data" -c port=$port -c listen_addresses=127.0.0.1 \
    -c unix_socket_directories="$to" -c hba_file="$to/data/pg_hba.conf" -c ident_file="$to/data/pg_ident.conf" \
    -c archive_mode=off -c synchronous_standby_names= -c primary_conninfo= -c primary_slot_name= \
    -c cluster_name=railguard-restored) >"$to/postgres.log" 2>&1 &
  echo $! >"$dir/pids/restored"
  for _ in $(seq 1 240); do
    if [ "$(PGPASSWORD=$su "$bindir/psql" -h 127.0.0.1 -p $port -U railguard -d railguard -Atc 'SELECT pg_is_in_recovery()' 2>/dev/null)" = f ]; then
      echo "restored_url=postgresql://railguard_collector@127.0.0.1:$port/railguard?$(tls_query)"
      echo "password_file=$dir/secrets/collector"
      return 0
    fi
    sleep 0.5
  done
  echo "pg-ha: the restored server did not finish recovery (log: $to/postgres.log)" >&2
  return 1
}

down() {
  [ -d "$dir/pids" ] || return 0
  for f in "$dir"/pids/*; do
    [ -e "$f" ] || continue
    kill "$(cat "$f")" 2>/dev/null || true
  done
  # Patroni stops its Postgres on SIGTERM; wait for them, then make sure.
  for _ in $(seq 1 40); do
    alive=0
    for f in "$dir"/pids/*; do kill -0 "$(cat "$f")" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break
    sleep 0.25
  done
  for f in "$dir"/pids/*; do kill -9 "$(cat "$f")" 2>/dev/null || true; done
  # A postmaster Patroni left behind is stopped by pg_ctl as the Postgres user: never a pid read
  # from a file that user can write, signalled as root.
  for m in "${members[@]}"; do
    if [ -f "$dir/$m/data/postmaster.pid" ]; then
      (as_pg "$bindir/pg_ctl" -D "$dir/$m/data" -m immediate -w -t 10 stop) >/dev/null 2>&1 || true
    fi
  done
  rm -rf "$dir/pids"
}

# DIR/tls: a CA of this cluster's own and the members' server certificate (127.0.0.1), made once.
tls_certs() {
  local t=$dir/tls
  [ -s "$t/server.crt" ] && return 0
  mkdir -p "$t"
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=railguard pg-ha CA" \
    -keyout "$t/ca.key" -out "$t/ca.crt" >"$dir/logs/tls.log" 2>&1
  openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" -keyout "$t/server.key" -out "$t/server.csr" \
    >>"$dir/logs/tls.log" 2>&1
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >"$t/server.ext"
  openssl x509 -req -in "$t/server.csr" -CA "$t/ca.crt" -CAkey "$t/ca.key" -CAcreateserial -days 3650 \
    -extfile "$t/server.ext" -out "$t/server.crt" >>"$dir/logs/tls.log" 2>&1
  chmod 600 "$t/ca.key" "$t/server.key"
  chmod 644 "$t/ca.crt" "$t/server.crt"
  chmod 755 "$t"
  [ "$(id -u)" = 0 ] && chown "$pg_user:" "$t/server.key" "$t/server.crt"
  return 0
}

# The query a URL of this cluster ends with: verified TLS against its CA.
tls_query() { echo "sslmode=verify-full&sslrootcert=$dir/tls/ca.crt"; }

# curl to this cluster's HTTPS endpoints (etcd, Patroni's REST API), verified against its CA.
tls_curl() { curl --cacert "$dir/tls/ca.crt" "$@"; }

etcd_call() { # etcd v3 JSON gateway PATH, the request on stdin; fails on an error answer
  tls_curl -fsS -X POST "https://127.0.0.1:$base/v3/$1" -H 'Content-Type: application/json' --data-binary @- >/dev/null 2>&1
}

secret() { # name → a password kept in DIR/secrets/name (0600)
  local f="$dir/secrets/$1"
  [ -s "$f" ] || (umask 077 && head -c 24 /dev/urandom | base64 | tr -d '/+=' >"$f")
  cat "$f"
}

up() {
  command -v patroni >/dev/null && command -v etcd >/dev/null && command -v haproxy >/dev/null ||
    { echo "pg-ha: patroni, etcd and haproxy are needed (scripts/setup.sh installs Debian's)" >&2; exit 1; }
  [ -n "$bindir" ] || { echo "pg-ha: no PostgreSQL server binaries under /usr/lib/postgresql" >&2; exit 1; }
  if [ -d "$dir/pids" ]; then
    for f in "$dir"/pids/*; do
      [ -e "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null &&
        { echo "pg-ha: $dir is already up ($(basename "$f") runs); down it first" >&2; exit 1; }
    done
  fi
  # All or nothing from here: a failure (or Ctrl-C) stops every process this run started.
  trap 'rc=$?; trap - EXIT INT TERM; echo "pg-ha: up failed; stopping what it started" >&2; down; exit $(( rc ? rc : 1 ))' EXIT
  trap 'exit 130' INT TERM
  mkdir -p "$dir"/{pids,secrets,logs,backup}
  chmod 700 "$dir/secrets" "$dir/backup"
  [ "$(id -u)" = 0 ] && chown "$pg_user:" "$dir/backup"
  dir=$(cd "$dir" && pwd)
  local su rep rest etcd_pw coll
  su=$(secret superuser)
  rep=$(secret replication)
  rest=$(secret restapi)
  etcd_pw=$(secret etcd)
  coll=$(secret collector)
  tls_certs

  # TLS on both of etcd's ports; a peer must hold a certificate of this cluster's CA, a client
  # its password (etcd's JSON gateway, which Patroni speaks, cannot carry a client certificate's
  # name, so client certificates are not asked for).
  etcd --name e0 --data-dir "$dir/etcd" \
    --listen-client-urls "https://127.0.0.1:$base" --advertise-client-urls "https://127.0.0.1:$base" \
    --cert-file "$dir/tls/server.crt" --key-file "$dir/tls/server.key" \
    --listen-peer-urls "https://127.0.0.1:$((base + 1))" --initial-advertise-peer-urls "https://127.0.0.1:$((base + 1))" \
    --peer-cert-file "$dir/tls/server.crt" --peer-key-file "$dir/tls/server.key" \
    --peer-trusted-ca-file "$dir/tls/ca.crt" --peer-client-cert-auth \
    --initial-cluster "e0=https://127.0.0.1:$((base + 1))" >"$dir/logs/etcd.log" 2>&1 &
  echo $! >"$dir/pids/etcd"
  for _ in $(seq 1 40); do tls_curl -fsS "https://127.0.0.1:$base/health" >/dev/null 2>&1 && break; sleep 0.25; done
  # Authentication on: a root user (Patroni's), over etcd's JSON gateway with the password on
  # stdin. An etcd that already has it on (a DIR brought up before) refuses the first call.
  if printf '{"name":"root","password":"%s"}' "$etcd_pw" | etcd_call auth/user/add; then
    printf '{"name":"root"}' | etcd_call auth/role/add
    printf '{"user":"root","role":"root"}' | etcd_call auth/user/grant
    printf '{}' | etcd_call auth/enable
  fi

  for i in 0 1 2; do
    local m=${members[$i]}
    mkdir -p "$dir/$m"
    chmod 700 "$dir/$m"
    [ "$(id -u)" = 0 ] && chown "$pg_user:" "$dir/$m"
    cat >"$dir/$m/patroni.yml" <<YML
scope: railguard
namespace: /railguard/
name: $m
restapi:
  listen: 127.0.0.1:$((base + 20 + i))
  connect_address: 127.0.0.1:$((base + 20 + i))
  certfile: $dir/tls/server.crt
  keyfile: $dir/tls/server.key
  authentication:
    username: patroni
    password: "$rest"
ctl:
  cacert: $dir/tls/ca.crt
etcd3:
  hosts: 127.0.0.1:$base
  protocol: https
  cacert: $dir/tls/ca.crt
  username: root
  password: "$etcd_pw"
bootstrap:
  dcs:
    ttl: 10
    loop_wait: 1
    retry_timeout: 5
    maximum_lag_on_failover: 1048576
    synchronous_mode: true
    postgresql:
      use_pg_rewind: true
      parameters:
        synchronous_commit: "on"
        wal_level: replica
        hot_standby: "on"
        max_wal_senders: 10
        max_replication_slots: 10
        wal_log_hints: "on"
        max_connections: 200
        archive_mode: "on"
  initdb:
    - encoding: UTF8
    - locale: C
    - auth: scram-sha-256
postgresql:
  # The whole of pg_hba.conf (Patroni writes it at every start; initdb's lines are gone): TLS on
  # every TCP connection, scram everywhere.
  pg_hba:
    - local all all scram-sha-256
    - local replication all scram-sha-256
    - hostssl replication replicator 127.0.0.1/32 scram-sha-256
    - hostssl all all 127.0.0.1/32 scram-sha-256
    - hostnossl replication all 127.0.0.1/32 reject
    - hostnossl all all 127.0.0.1/32 reject
  listen: 127.0.0.1:$((base + 10 + i))
  connect_address: 127.0.0.1:$((base + 10 + i))
  data_dir: $dir/$m/data
  bin_dir: $bindir
  pgpass: $dir/$m/pgpass
  authentication:
    superuser:
      username: railguard
      password: "$su"
    replication:
      username: replicator
      password: "$rep"
  parameters:
    unix_socket_directories: "$dir/$m"
    ssl: "on"
    ssl_cert_file: "$dir/tls/server.crt"
    ssl_key_file: "$dir/tls/server.key"
    archive_command: "pgbackrest --config=$dir/$m/pgbackrest.conf --stanza=railguard archive-push %p"
tags:
  nofailover: false
  noloadbalance: false
YML
    chmod 600 "$dir/$m/patroni.yml"
    backrest_conf "$dir/$m" "$dir/$m/data" $((base + 10 + i))
    [ "$(id -u)" = 0 ] && chown "$pg_user:" "$dir/$m/patroni.yml"
    (as_pg patroni "$dir/$m/patroni.yml") >"$dir/logs/$m.log" 2>&1 &
    echo $! >"$dir/pids/$m"
    # The first member bootstraps alone; the others then clone it.
    if [ "$i" = 0 ]; then
      for _ in $(seq 1 120); do
        tls_curl -fsS "https://127.0.0.1:$((base + 20))/primary" >/dev/null 2>&1 && break
        sleep 0.5
      done
    fi
  done

  cat >"$dir/haproxy.cfg" <<CFG
global
  maxconn 1000
defaults
  mode tcp
  timeout connect 2s
  timeout client 30m
  timeout server 30m
  timeout check 1s
  # A member that stopped listening before its health check failed (a replica restarting to
  # follow a new timeline): the connection is tried again, the last time on another member.
  retries 2
  option redispatch
listen write
  bind 127.0.0.1:$((base + 30))
  option httpchk OPTIONS /primary
  http-check expect status 200
  default-server inter 500ms fall 2 rise 2 on-marked-down shutdown-sessions check-ssl verify required ca-file $dir/tls/ca.crt
  server pg0 127.0.0.1:$((base + 10)) check port $((base + 20))
  server pg1 127.0.0.1:$((base + 11)) check port $((base + 21))
  server pg2 127.0.0.1:$((base + 12)) check port $((base + 22))
listen read
  bind 127.0.0.1:$((base + 31))
  balance roundrobin
  option httpchk OPTIONS /replica
  http-check expect status 200
  default-server inter 500ms fall 2 rise 2 on-marked-down shutdown-sessions check-ssl verify required ca-file $dir/tls/ca.crt
  server pg0 127.0.0.1:$((base + 10)) check port $((base + 20))
  server pg1 127.0.0.1:$((base + 11)) check port $((base + 21))
  server pg2 127.0.0.1:$((base + 12)) check port $((base + 22))
CFG
  haproxy -f "$dir/haproxy.cfg" >"$dir/logs/haproxy.log" 2>&1 &
  echo $! >"$dir/pids/haproxy"

  # Ready: a leader, two streaming replicas, one of them the synchronous standby.
  for _ in $(seq 1 240); do
    if tls_curl -fsS "https://127.0.0.1:$((base + 20))/cluster" 2>/dev/null | python3 -c '
import json, sys
m = json.load(sys.stdin)["members"]
roles = sorted(x["role"] for x in m)
ok = roles.count("leader") == 1 and roles.count("sync_standby") == 1 and len(m) == 3 and all(x["state"] in ("running", "streaming") for x in m)
sys.exit(0 if ok else 1)'; then
      # psql over the write port answers too.
      if PGPASSWORD=$su "$bindir/psql" -h 127.0.0.1 -p $((base + 30)) -U railguard -d postgres -Atc 'SELECT 1' >/dev/null 2>&1; then
        # The collector's own role (its password on psql's stdin), owner of its database.
        printf "DO \$\$ BEGIN
                  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'railguard_collector') THEN
                    CREATE ROLE railguard_collector LOGIN;
                  END IF;
                END \$\$;
                ALTER ROLE railguard_collector PASSWORD '%s';
                GRANT pg_monitor TO railguard_collector;\n" "$coll" |
          PGPASSWORD=$su "$bindir/psql" -h 127.0.0.1 -p $((base + 30)) -U railguard -d postgres -v ON_ERROR_STOP=1 -qf - >/dev/null
        PGPASSWORD=$su "$bindir/psql" -h 127.0.0.1 -p $((base + 30)) -U railguard -d postgres -Atc \
          "SELECT 1 FROM pg_database WHERE datname = 'railguard'" | grep -q 1 ||
          PGPASSWORD=$su "$bindir/psql" -h 127.0.0.1 -p $((base + 30)) -U railguard -d postgres -qc \
            'CREATE DATABASE railguard OWNER railguard_collector'
        # The archive's stanza, so the primary's WAL is kept from here on.
        backrest "$dir/$(leader_name)/pgbackrest.conf" stanza-create >"$dir/logs/stanza-create.log" 2>&1 ||
          { echo "pg-ha: pgbackrest stanza-create failed:" >&2; cat "$dir/logs/stanza-create.log" >&2; return 1; }
        echo "write_url=postgresql://railguard_collector@127.0.0.1:$((base + 30))/railguard?$(tls_query)"
        echo "read_url=postgresql://railguard_collector@127.0.0.1:$((base + 31))/railguard?$(tls_query)"
        echo "password_file=$dir/secrets/collector"
        trap - EXIT INT TERM
        return 0
      fi
    fi
    sleep 0.5
  done
  echo "pg-ha: the cluster did not come up (logs in $dir/logs); their ends:" >&2
  for f in "$dir"/logs/*.log; do echo "== $f" >&2; tail -n 15 "$f" >&2; done
  tls_curl -sS "https://127.0.0.1:$((base + 20))/cluster" >&2 || true
  return 1
}

case "$cmd" in
  up) up ;;
  status) status ;;
  switchover) switchover ;;
  backup) backup ;;
  archive) archive ;;
  restore) restore "${3:-}" "${4:-}" ;;
  down) down ;;
  *) echo "usage: $0 up|status|switchover|backup|archive|restore|down DIR" >&2; exit 2 ;;
esac
