#!/usr/bin/env bash
# Starts a real etcd, kube-apiserver and kube-controller-manager (garbage collector and namespace
# controllers) on loopback with certificates generated here, and writes .dev/kubeconfig.
# Idempotent: a control plane that answers is left alone.
#   hack/control-plane.sh start|stop
source "$(dirname "$0")/lib.sh"

ETCD_PORT="${SANDBOXD_ETCD_PORT:-23790}"
APISERVER_PORT="${SANDBOXD_APISERVER_PORT:-26443}"
CP="$DEV_DIR/control-plane"
PKI="$CP/pki"
KUBECONFIG_FILE="$DEV_DIR/kubeconfig"

api_ready() {
  "$KUBE_BIN/kubectl" --kubeconfig "$KUBECONFIG_FILE" get --raw /readyz >/dev/null 2>&1
}
etcd_ready() { curl -fsS "http://127.0.0.1:$ETCD_PORT/health" 2>/dev/null | grep -q '"health":"true"'; }
# A killed process may linger as a zombie until PID 1 reaps it: it counts as gone.
alive() {
  [[ -f $CP/$1.pid ]] || return 1
  local pid; pid=$(cat "$CP/$1.pid")
  kill -0 "$pid" 2>/dev/null && [[ $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) != Z ]]
}

certs() {
  [[ -f $PKI/apiserver.crt ]] && return 0
  mkdir -p "$PKI"
  log "generating certificates in $PKI"
  (
    cd "$PKI"
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -keyout ca.key -out ca.crt -subj "/CN=sandboxd-dev-ca" 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr -subj "/CN=kube-apiserver" 2>/dev/null
    printf 'subjectAltName=DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,IP:127.0.0.1,IP:10.0.0.1\n' >san.ext
    openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 -extfile san.ext -out apiserver.crt 2>/dev/null
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
    head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >admin.token
    printf '%s,admin,admin-uid,"system:masters"\n' "$(cat admin.token)" >tokens.csv
  )
}

kubeconfig() {
  local ca; ca=$(base64 -w0 <"$PKI/ca.crt")
  cat >"$KUBECONFIG_FILE.tmp" <<KC
apiVersion: v1
kind: Config
clusters:
- name: sandboxd-dev
  cluster:
    server: https://127.0.0.1:$APISERVER_PORT
    certificate-authority-data: $ca
users:
- name: admin
  user:
    token: $(cat "$PKI/admin.token")
contexts:
- name: sandboxd-dev
  context: {cluster: sandboxd-dev, user: admin, namespace: default}
current-context: sandboxd-dev
KC
  mv "$KUBECONFIG_FILE.tmp" "$KUBECONFIG_FILE"
}

# A component whose process lives is waited for, never started twice: a second one could not
# bind the port (or lock the data dir) and would overwrite the pid file of the one that runs.
# An API server that lost etcd serves again by itself once etcd is back.
start_etcd() {
  if alive etcd; then
    WAIT_PID=$(cat "$CP/etcd.pid") wait_for "etcd (log: $CP/etcd.log)" 60 etcd_ready
    return 0
  fi
  log "starting etcd v$ETCD_VERSION on 127.0.0.1:$ETCD_PORT"
  mkdir -p "$CP/etcd"
  setsid "$ETCD_BIN/etcd" \
    --name sandboxd-dev --data-dir "$CP/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$((ETCD_PORT + 10))" \
    --initial-advertise-peer-urls "http://127.0.0.1:$((ETCD_PORT + 10))" \
    --initial-cluster "sandboxd-dev=http://127.0.0.1:$((ETCD_PORT + 10))" \
    --unsafe-no-fsync --log-level warn \
    >"$CP/etcd.log" 2>&1 </dev/null &
  echo $! >"$CP/etcd.pid"
  WAIT_PID=$! wait_for "etcd (log: $CP/etcd.log)" 60 etcd_ready
}

start_apiserver() {
  if alive kube-apiserver; then
    WAIT_PID=$(cat "$CP/kube-apiserver.pid") wait_for "kube-apiserver (log: $CP/kube-apiserver.log)" 120 api_ready
    return 0
  fi
  log "starting kube-apiserver v$KUBERNETES_VERSION on 127.0.0.1:$APISERVER_PORT"
  setsid "$KUBE_BIN/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --bind-address 127.0.0.1 --secure-port "$APISERVER_PORT" --advertise-address 127.0.0.1 \
    --cert-dir "$PKI" --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
    --client-ca-file "$PKI/ca.crt" --token-auth-file "$PKI/tokens.csv" \
    --service-cluster-ip-range 10.0.0.0/24 --allow-privileged=true \
    --authorization-mode RBAC --disable-admission-plugins ServiceAccount \
    --service-account-issuer "https://127.0.0.1:$APISERVER_PORT/" \
    --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
    --endpoint-reconciler-type none --enable-priority-and-fairness=false \
    >"$CP/kube-apiserver.log" 2>&1 </dev/null &
  echo $! >"$CP/kube-apiserver.pid"
  WAIT_PID=$! wait_for "kube-apiserver (log: $CP/kube-apiserver.log)" 120 api_ready
}

start_controller_manager() {
  alive kube-controller-manager && return 0
  log "starting kube-controller-manager (garbage collector, namespace controller)"
  setsid "$KUBE_BIN/kube-controller-manager" \
    --kubeconfig "$KUBECONFIG_FILE" --authentication-kubeconfig "$KUBECONFIG_FILE" \
    --authorization-kubeconfig "$KUBECONFIG_FILE" \
    --controllers garbage-collector-controller,namespace-controller \
    --leader-elect=false --bind-address 127.0.0.1 --secure-port 0 \
    >"$CP/kube-controller-manager.log" 2>&1 </dev/null &
  echo $! >"$CP/kube-controller-manager.pid"
  WAIT_PID=$! wait_for "kube-controller-manager (log: $CP/kube-controller-manager.log)" 30 alive kube-controller-manager
}

start() {
  for bin in "$KUBE_BIN/kube-apiserver" "$KUBE_BIN/kube-controller-manager" "$KUBE_BIN/kubectl" "$ETCD_BIN/etcd"; do
    [[ -x $bin ]] || die "$bin is missing: run hack/build-control-plane.sh"
  done
  mkdir -p "$CP"
  certs
  kubeconfig
  start_etcd
  start_apiserver
  start_controller_manager
  wait_for "the default namespace" 60 "$KUBE_BIN/kubectl" --kubeconfig "$KUBECONFIG_FILE" get namespace default
}

stop() {
  for name in kube-controller-manager kube-apiserver etcd; do
    if alive "$name"; then
      local pid; pid=$(cat "$CP/$name.pid")
      log "stopping $name (pid $pid)"
      kill "$pid"
      local deadline=$((SECONDS + 20))
      while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
      kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
    fi
    rm -f "$CP/$name.pid"
  done
  rm -rf "$CP/etcd"
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  *) die "usage: $0 start|stop" ;;
esac
