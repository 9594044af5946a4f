#!/usr/bin/env bash
# Starts a dockerd of the project's own: socket .dev/docker.sock, data root in the cache (so
# images survive between checkouts), exec root and pid file in .dev. Installs Debian's docker.io
# when dockerd is missing. Idempotent: an answering daemon is left alone.
#   hack/dockerd.sh start|stop
source "$(dirname "$0")/lib.sh"

SOCK="$DEV_DIR/docker.sock"
PIDFILE="$DEV_DIR/dockerd.pid"
DATA_ROOT="$CACHE_DIR/docker"
# exec-root holds unix sockets: keep its path short, and distinct per checkout.
EXEC_ROOT="/run/sandboxd-docker-$(printf '%s' "$ROOT_DIR" | sha256sum | cut -c1-8)"

answering() { DOCKER_HOST="unix://$SOCK" docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }

install_docker() {
  command -v dockerd >/dev/null && command -v docker >/dev/null && return 0
  log "installing Debian's docker.io"
  [[ $(id -u) == 0 ]] || die "dockerd is missing and installing it needs root: apt-get install docker.io"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io crun >/dev/null
}

start() {
  mkdir -p "$DEV_DIR" "$DATA_ROOT"
  if answering; then return 0; fi
  install_docker
  [[ $(id -u) == 0 ]] || die "dockerd needs root to start containers; run make up as root"
  if [[ -f $PIDFILE ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
    log "dockerd (pid $(cat "$PIDFILE")) is running but not answering; restarting it"
    stop
  fi
  rm -f "$SOCK" "$PIDFILE"
  log "starting dockerd on $SOCK (data root $DATA_ROOT)"
  # A second OCI runtime name for SANDBOXD_OCI_RUNTIME: crun where the host's cgroups allow it
  # (it refuses hybrid v1/v2 hierarchies), and runc under its own name, which works everywhere.
  local runtimes=(--add-runtime "runc-alt=$(command -v runc)")
  command -v crun >/dev/null && runtimes+=(--add-runtime "crun=$(command -v crun)")
  setsid dockerd \
    --host "unix://$SOCK" \
    --data-root "$DATA_ROOT" \
    --exec-root "$EXEC_ROOT" \
    --pidfile "$PIDFILE" \
    "${runtimes[@]}" \
    >"$DEV_DIR/dockerd.log" 2>&1 </dev/null &
  wait_for "dockerd (log: $DEV_DIR/dockerd.log)" 60 answering
  log "dockerd $(DOCKER_HOST="unix://$SOCK" docker version --format '{{.Server.Version}} (API {{.Server.APIVersion}})') is up"
}

stop() {
  [[ -f $PIDFILE ]] || return 0
  local pid; pid=$(cat "$PIDFILE")
  if kill -0 "$pid" 2>/dev/null; then
    log "stopping dockerd (pid $pid)"
    kill "$pid"
    local deadline=$((SECONDS + 30))
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
  fi
  rm -f "$PIDFILE" "$SOCK"
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  *) die "usage: $0 start|stop" ;;
esac
