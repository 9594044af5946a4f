#!/usr/bin/env bash
# Starts a real etcd, kube-apiserver and kube-controller-manager on loopback with certificates
# generated here, and writes .dev/kubeconfig. The API server authorizes with Node,RBAC and admits
# ServiceAccounts, and the controller-manager runs what pods of the local node (hack/node.sh)
# need: deployments, replica sets, daemon sets, jobs, service accounts and their tokens, node
# lifecycle, garbage collection and namespaces. The kubelet and kube-scheduler get identities
# of their own (.dev/control-plane/{kubelet,scheduler}.kubeconfig).
# Idempotent: a control plane that answers is left alone.
#   hack/control-plane.sh start|stop
# SANDBOXD_ETCD_PORT and SANDBOXD_APISERVER_PORT move it off its ports (a second checkout's).
source "$(dirname "$0")/lib.sh"

ETCD_PORT="${SANDBOXD_ETCD_PORT:-23790}"
APISERVER_PORT="${SANDBOXD_APISERVER_PORT:-26443}"
CP="$DEV_DIR/control-plane"
PKI="$CP/pki"
KUBECONFIG_FILE="$DEV_DIR/kubeconfig"
# The local node's name (hack/node.sh registers it with --hostname-override): its InternalIP is
# then 127.0.0.1, so the pods of the node's network are reached on loopback.
NODE_NAME=127.0.0.1
# node-lifecycle: drops the not-ready taint a node registers with; clusterrole-aggregation:
# fills view/edit/admin; the token and root CA controllers: in-cluster clients.
CONTROLLERS=garbage-collector-controller,namespace-controller,deployment-controller
CONTROLLERS+=,replicaset-controller,daemonset-controller,job-controller,node-lifecycle-controller
CONTROLLERS+=,serviceaccount-controller,serviceaccount-token-controller
CONTROLLERS+=,root-ca-certificate-publisher-controller,clusterrole-aggregation-controller

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
  )
}

# The API server's token file: the admin, the node's kubelet (system:node:<node>, which the Node
# authorizer limits to its own node's objects) and kube-scheduler (its bootstrap role).
# Written at every start, so a checkout made before the node existed gets the two new ones.
tokens() {
  local who
  for who in admin kubelet scheduler; do
    [[ -s $PKI/$who.token ]] || head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$PKI/$who.token"
  done
  {
    printf '%s,admin,admin-uid,"system:masters"\n' "$(cat "$PKI/admin.token")"
    printf '%s,system:node:%s,kubelet-uid,"system:nodes"\n' "$(cat "$PKI/kubelet.token")" "$NODE_NAME"
    printf '%s,system:kube-scheduler,kube-scheduler-uid\n' "$(cat "$PKI/scheduler.token")"
  } >"$PKI/tokens.csv"
}

# kubeconfig FILE USER: a kubeconfig for the token of USER (admin, kubelet, scheduler).
kubeconfig() {
  local file="$1" who="$2" ca; ca=$(base64 -w0 <"$PKI/ca.crt")
  cat >"$file.tmp" <<KC
apiVersion: v1
kind: Config
clusters:
- name: sandboxd-dev
  cluster:
    server: https://127.0.0.1:$APISERVER_PORT
    certificate-authority-data: $ca
users:
- name: $who
  user:
    token: $(cat "$PKI/$who.token")
contexts:
- name: sandboxd-dev
  context: {cluster: sandboxd-dev, user: $who, namespace: default}
current-context: sandboxd-dev
KC
  mv "$file.tmp" "$file"
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
    --authorization-mode Node,RBAC \
    --service-account-issuer "https://127.0.0.1:$APISERVER_PORT/" \
    --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
    --endpoint-reconciler-type none --enable-priority-and-fairness=false \
    >"$CP/kube-apiserver.log" 2>&1 </dev/null &
  echo $! >"$CP/kube-apiserver.pid"
  WAIT_PID=$! wait_for "kube-apiserver (log: $CP/kube-apiserver.log)" 120 api_ready
}

start_controller_manager() {
  alive kube-controller-manager && return 0
  log "starting kube-controller-manager"
  setsid "$KUBE_BIN/kube-controller-manager" \
    --kubeconfig "$KUBECONFIG_FILE" --authentication-kubeconfig "$KUBECONFIG_FILE" \
    --authorization-kubeconfig "$KUBECONFIG_FILE" \
    --controllers "$CONTROLLERS" \
    --service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" \
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
  tokens
  kubeconfig "$KUBECONFIG_FILE" admin
  kubeconfig "$CP/kubelet.kubeconfig" kubelet
  kubeconfig "$CP/scheduler.kubeconfig" scheduler
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
