#!/usr/bin/env bash
# A highly available Postgres for railguard's collector, on loopback: one etcd member, three
# PostgreSQL 15 members under Patroni with synchronous replication (an acknowledged COMMIT is on
# the primary and a synchronous standby), and HAProxy routing a read-write port to the primary
# and a read-only port to the replicas by Patroni's REST health checks.
#
#   scripts/pg-ha.sh up DIR      start everything under DIR; prints write_url=… and read_url=…
#   scripts/pg-ha.sh status DIR  prints leader=<member> pid=<its postmaster's pid>
#   scripts/pg-ha.sh down DIR    stops everything it started
#
# Ports: PGHA_PORT_BASE (default 25400) + 0/1 etcd, +10..12 Postgres, +20..22 Patroni REST,
# +30 read-write, +31 read-only. The passwords are generated into DIR/secrets (0600). Run as
# root, Postgres runs as RAILGUARD_PG_USER (default railguard-pg, made by scripts/setup.sh).
# The same layout for real hosts: docs/ha-postgres.md.
set -euo pipefail

cmd=${1:-}
dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || { echo "usage: $0 up|status|down DIR" >&2; exit 2; }
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
  # Any member's REST API knows the cluster; the first that answers names the leader.
  local leader="" i
  for i in 0 1 2; do
    leader=$(curl -fsS "http://127.0.0.1:$((base + 20 + i))/cluster" 2>/dev/null |
      python3 -c 'import json,sys; print(next((m["name"] for m in json.load(sys.stdin)["members"] if m["role"] == "leader"), ""))' 2>/dev/null || true)
    [ -n "$leader" ] && break
  done
  [ -n "$leader" ] || { echo "pg-ha: no leader" >&2; return 1; }
  echo "leader=$leader pid=$(head -1 "$dir/$leader/data/postmaster.pid" 2>/dev/null || echo none)"
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
  for m in "${members[@]}"; do
    [ -f "$dir/$m/data/postmaster.pid" ] && kill -9 "$(head -1 "$dir/$m/data/postmaster.pid")" 2>/dev/null || true
  done
  rm -rf "$dir/pids"
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
  mkdir -p "$dir"/{pids,secrets,logs}
  chmod 700 "$dir/secrets"
  dir=$(cd "$dir" && pwd)
  local su rep
  su=$(secret superuser)
  rep=$(secret replication)

  etcd --name e0 --data-dir "$dir/etcd" \
    --listen-client-urls "http://127.0.0.1:$base" --advertise-client-urls "http://127.0.0.1:$base" \
    --listen-peer-urls "http://127.0.0.1:$((base + 1))" --initial-advertise-peer-urls "http://127.0.0.1:$((base + 1))" \
    --initial-cluster "e0=http://127.0.0.1:$((base + 1))" >"$dir/logs/etcd.log" 2>&1 &
  echo $! >"$dir/pids/etcd"
  for _ in $(seq 1 40); do curl -fsS "http://127.0.0.1:$base/health" >/dev/null 2>&1 && break; sleep 0.25; done

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
etcd3:
  hosts: 127.0.0.1:$base
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
  initdb:
    - encoding: UTF8
    - locale: C
    - auth: scram-sha-256
  pg_hba:
    - local all all scram-sha-256
    - host replication replicator 127.0.0.1/32 scram-sha-256
    - host all all 127.0.0.1/32 scram-sha-256
postgresql:
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
tags:
  nofailover: false
  noloadbalance: false
YML
    chmod 600 "$dir/$m/patroni.yml"
    [ "$(id -u)" = 0 ] && chown "$pg_user:" "$dir/$m/patroni.yml"
    (as_pg patroni "$dir/$m/patroni.yml") >"$dir/logs/$m.log" 2>&1 &
    echo $! >"$dir/pids/$m"
    # The first member bootstraps alone; the others then clone it.
    if [ "$i" = 0 ]; then
      for _ in $(seq 1 120); do
        curl -fsS "http://127.0.0.1:$((base + 20))/primary" >/dev/null 2>&1 && break
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
listen write
  bind 127.0.0.1:$((base + 30))
  option httpchk OPTIONS /primary
  http-check expect status 200
  default-server inter 500ms fall 2 rise 2 on-marked-down shutdown-sessions
  server pg0 127.0.0.1:$((base + 10)) check port $((base + 20))
  server pg1 127.0.0.1:$((base + 11)) check port $((base + 21))
  server pg2 127.0.0.1:$((base + 12)) check port $((base + 22))
listen read
  bind 127.0.0.1:$((base + 31))
  balance roundrobin
  option httpchk OPTIONS /replica
  http-check expect status 200
  default-server inter 500ms fall 2 rise 2 on-marked-down shutdown-sessions
  server pg0 127.0.0.1:$((base + 10)) check port $((base + 20))
  server pg1 127.0.0.1:$((base + 11)) check port $((base + 21))
  server pg2 127.0.0.1:$((base + 12)) check port $((base + 22))
CFG
  haproxy -f "$dir/haproxy.cfg" >"$dir/logs/haproxy.log" 2>&1 &
  echo $! >"$dir/pids/haproxy"

  # Ready: a leader, two streaming replicas, one of them the synchronous standby.
  for _ in $(seq 1 240); do
    if curl -fsS "http://127.0.0.1:$((base + 20))/cluster" 2>/dev/null | python3 -c '
import json, sys
m = json.load(sys.stdin)["members"]
roles = sorted(x["role"] for x in m)
ok = roles.count("leader") == 1 and roles.count("sync_standby") == 1 and len(m) == 3 and all(x["state"] in ("running", "streaming") for x in m)
sys.exit(0 if ok else 1)'; then
      # psql over the write port answers too.
      if PGPASSWORD=$su "$bindir/psql" -h 127.0.0.1 -p $((base + 30)) -U railguard -d postgres -Atc 'SELECT 1' >/dev/null 2>&1; then
        PGPASSWORD=$su "$bindir/psql" -h 127.0.0.1 -p $((base + 30)) -U railguard -d postgres -Atc \
          "SELECT 1 FROM pg_database WHERE datname = 'railguard'" | grep -q 1 ||
          PGPASSWORD=$su "$bindir/psql" -h 127.0.0.1 -p $((base + 30)) -U railguard -d postgres -qc 'CREATE DATABASE railguard'
        echo "write_url=postgresql://railguard:$su@127.0.0.1:$((base + 30))/railguard"
        echo "read_url=postgresql://railguard:$su@127.0.0.1:$((base + 31))/railguard"
        return 0
      fi
    fi
    sleep 0.5
  done
  echo "pg-ha: the cluster did not come up (logs in $dir/logs)" >&2
  return 1
}

case "$cmd" in
  up) up ;;
  status) status ;;
  down) down ;;
  *) echo "usage: $0 up|status|down DIR" >&2; exit 2 ;;
esac
