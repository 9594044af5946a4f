#!/usr/bin/env bash
# Starts a dockerd of the project's own: socket .dev/docker.sock, data root in the cache (so
# images survive between checkouts), exec root and pid file in .dev, its configuration (the OCI
# runtimes beside runc, gVisor's runsc among them) in .dev/dockerd.json. Installs Debian's
# docker.io when dockerd is missing. Idempotent: an answering daemon started with the same
# configuration is left alone; one started with another (or by an older version of this script)
# is restarted, which ends its containers.
#   hack/dockerd.sh start|stop|config
source "$(dirname "$0")/lib.sh"

SOCK="$DEV_DIR/docker.sock"
PIDFILE="$DEV_DIR/dockerd.pid"
DATA_ROOT="$CACHE_DIR/docker"
# exec-root holds unix sockets: keep its path short, and distinct per checkout.
EXEC_ROOT="/run/sandboxd-docker-$(printf '%s' "$ROOT_DIR" | sha256sum | cut -c1-8)"
CONFIG="$DEV_DIR/dockerd.json"

answering() { DOCKER_HOST="unix://$SOCK" docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }

install_docker() {
  command -v dockerd >/dev/null && command -v docker >/dev/null && return 0
  log "installing Debian's docker.io"
  [[ $(id -u) == 0 ]] || die "dockerd is missing and installing it needs root: apt-get install docker.io"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io crun >/dev/null
}

# config: the daemon.json this script starts dockerd with, on stdout. Its OCI runtimes beside
# Docker's default runc, each a name for SANDBOXD_OCI_RUNTIME:
#   runc-alt  runc under a second name, which works everywhere;
#   crun      where installed (it refuses hybrid v1/v2 cgroup hierarchies, such as this machine's);
#   runsc     gVisor (hack/runsc.sh) on its systrap platform (kvm needs vmx/svm, which VMs
#             without nested virtualisation lack, and hangs there); --host-uds=create lets a
#             program in the sandbox bind a Unix socket in a bind-mounted folder that host
#             programs connect to (the resident agent's socket in /run/sandboxd; without it the
#             socket exists only inside the sandbox). --directfs=false: the files' host
#             descriptors are the gofer's, not the sentry's, so a sandbox that spends them all (a
#             folder 20,000 deep) cannot take the sentry's control socket and make itself
#             unkillable (docs/sandboxd.md, "Isolation"). Its network is gVisor's own (the default
#             --network=sandbox): on a user-defined network Docker's resolver at 127.0.0.11 is
#             out of its reach, so sandboxd mounts a resolv.conf of its own into a gVisor
#             sandbox on a network (docs/sandboxd.md, "Names under gVisor").
# experimental: for `docker checkpoint` (later work of issue #34); nothing else changes with it.
config() {
  local runsc; runsc=$("$HACK_DIR/runsc.sh" path)
  printf '{\n  "experimental": true,\n  "runtimes": {\n'
  printf '    "runc-alt": {"path": "%s"},\n' "$(command -v runc)"
  if command -v crun >/dev/null; then printf '    "crun": {"path": "%s"},\n' "$(command -v crun)"; fi
  printf '    "runsc": {"path": "%s", "runtimeArgs": ["--platform=systrap", "--host-uds=create", "--directfs=false"]}\n' "$runsc"
  printf '  }\n}\n'
}

# other_daemons: pids of the dockerds other than ours with our data root (another checkout's
# `make up`, a CI run): a second daemon on the same data root would fight the first over it.
other_daemons() {
  local pid ours="" root
  [[ -f $PIDFILE ]] && ours=$(cat "$PIDFILE")
  for pid in $(pgrep -x dockerd || true); do
    [[ $pid == "$ours" ]] && continue
    root=$(tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | sed -n '/^--data-root$/{n;p;q};s/^--data-root=//p' | head -1)
    [[ $root == "$DATA_ROOT" ]] && echo "$pid"
  done
  return 0
}

start() {
  mkdir -p "$DEV_DIR" "$DATA_ROOT"
  install_docker
  "$HACK_DIR/runsc.sh" build >/dev/null
  local want; want=$(config)
  if answering; then
    [[ -f $CONFIG && $(cat "$CONFIG") == "$want" ]] && return 0
    if ! [[ -f $PIDFILE ]] || ! kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
      log "warning: a dockerd answers on $SOCK without its pid in $PIDFILE; left alone though its configuration is not $CONFIG's"
      return 0
    fi
  fi
  [[ $(id -u) == 0 ]] || die "dockerd needs root to start containers; run make up as root"
  local others; others=$(other_daemons)
  [[ -z $others ]] || die "dockerd $(echo $others) (another checkout, or a CI run) uses the data root $DATA_ROOT; stop it first (its checkout's make down): two daemons cannot share it"
  if [[ -f $PIDFILE ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
    if answering; then
      log "dockerd (pid $(cat "$PIDFILE")) runs with another configuration than $CONFIG's; restarting it"
    else
      log "dockerd (pid $(cat "$PIDFILE")) is running but not answering; restarting it"
    fi
    stop
  fi
  rm -f "$SOCK" "$PIDFILE"
  printf '%s\n' "$want" >"$CONFIG"
  log "starting dockerd on $SOCK (data root $DATA_ROOT, runtimes: $(sed -n 's/^    "\([^"]*\)".*/\1/p' "$CONFIG" | tr '\n' ' ' | sed 's/ $//'))"
  setsid dockerd \
    --config-file "$CONFIG" \
    --host "unix://$SOCK" \
    --data-root "$DATA_ROOT" \
    --exec-root "$EXEC_ROOT" \
    --pidfile "$PIDFILE" \
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
  config) config ;;
  *) die "usage: $0 start|stop|config" ;;
esac
