#!/usr/bin/env bash
# Starts a PostgreSQL cluster of the project's own for the audit-store tests: Debian's
# `postgresql` package (installed when missing), listening on loopback only. Idempotent: an
# answering cluster is left alone.
#
# Run as root, the cluster belongs to the `postgres` account and lives in that account's home,
# one per checkout: PostgreSQL insists that its data directory is owned by it with mode 0700,
# which a checkout on a mount that ignores chown/chmod cannot give, and root's own home (where
# the caches live) is closed to that account. Run as anyone else, it lives in .dev/postgres.
#   hack/postgres.sh start|stop|url
source "$(dirname "$0")/lib.sh"

PG_PORT="${SANDBOXD_POSTGRES_PORT:-55432}"

# Sets PG_DIR, PG_DATA, PG_SOCK_DIR and PG_LOG. The `postgres` account exists only once the
# package is installed, so this runs after install_postgres.
settle_paths() {
  local home=""
  [[ $(id -u) == 0 ]] && home=$(getent passwd postgres | cut -d: -f6)
  if [[ -n $home ]]; then
    PG_DIR="$home/sandboxd-$(printf '%s' "$DEV_DIR" | sha256sum | cut -c1-12)"
  else
    PG_DIR="$DEV_DIR/postgres"
  fi
  PG_DATA="$PG_DIR/data"
  PG_SOCK_DIR="$PG_DIR/run"
  PG_LOG="$PG_DIR/postgres.log"
}
PG_DB=sandboxd_test
# Small shared memory, and dynamic shared memory in files of the data directory rather than in
# /dev/shm: the tests need little, and a container's /dev/shm may be small or missing.
PG_SMALL="-c shared_buffers=32MB -c dynamic_shared_memory_type=mmap"

pg_bin() {
  local dir
  dir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
  [[ -n $dir ]] && printf '%s' "$dir"
}

# Root may not run postgres; the cluster belongs to the `postgres` account the package creates.
as_pg() { if [[ $(id -u) == 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi; }

answering() { "$(pg_bin)/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT"; }

install_postgres() {
  [[ -n $(pg_bin) ]] && return 0
  log "installing Debian's postgresql"
  [[ $(id -u) == 0 ]] || die "PostgreSQL is missing and installing it needs root: apt-get install postgresql"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
}

start() {
  install_postgres
  local bin; bin=$(pg_bin)
  if answering; then return 0; fi
  settle_paths
  mkdir -p "$PG_SOCK_DIR" "$PG_DATA"
  if [[ $(id -u) == 0 ]]; then chown postgres: "$PG_DIR" "$PG_SOCK_DIR" "$PG_DATA"; fi
  chmod 700 "$PG_DATA"
  if [[ ! -f $PG_DATA/PG_VERSION ]]; then
    log "creating a PostgreSQL cluster in $PG_DATA"
    as_pg "$bin/initdb" -D "$PG_DATA" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >/dev/null
  fi
  touch "$PG_LOG"; [[ $(id -u) == 0 ]] && chown postgres: "$PG_LOG"
  log "starting PostgreSQL on 127.0.0.1:$PG_PORT (data $PG_DATA)"
  if ! as_pg "$bin/pg_ctl" -D "$PG_DATA" -l "$PG_LOG" -w -t 60 \
    -o "-p $PG_PORT -k $PG_SOCK_DIR -c listen_addresses=127.0.0.1 -c max_connections=200 -c fsync=off $PG_SMALL" start >/dev/null; then
    log "PostgreSQL did not start; the end of $PG_LOG:"
    tail -n 20 "$PG_LOG" >&2 || true
    die "PostgreSQL did not start on 127.0.0.1:$PG_PORT"
  fi
  wait_for "PostgreSQL (log: $PG_LOG)" 60 answering
  if ! "$bin/psql" -h 127.0.0.1 -p "$PG_PORT" -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname = '$PG_DB'" | grep -q 1; then
    "$bin/createdb" -h 127.0.0.1 -p "$PG_PORT" -U postgres "$PG_DB"
  fi
  log "PostgreSQL $("$bin/postgres" --version | awk '{print $3}') is up"
}

stop() {
  [[ -n $(pg_bin) ]] || return 0
  settle_paths
  [[ -f $PG_DATA/postmaster.pid ]] || return 0
  log "stopping PostgreSQL"
  as_pg "$(pg_bin)/pg_ctl" -D "$PG_DATA" -m fast -w stop >/dev/null || true
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  url) printf 'postgres://postgres@127.0.0.1:%s/%s' "$PG_PORT" "$PG_DB" ;;
  *) die "usage: $0 start|stop|url" ;;
esac
