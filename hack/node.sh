#!/usr/bin/env bash
# The local node: kube-scheduler, containerd (with runc) and a kubelet registered as the node
# `127.0.0.1` of the control plane hack/control-plane.sh started, so the chart runs as pods.
# All its state is in .dev/node; it listens on loopback only.
#   hack/node.sh start        starts what is not running and waits until the node is Ready
#   hack/node.sh stop         stops all of it; nothing of it stays running or mounted
#   hack/node.sh load IMAGE…  copies images from the project's dockerd into the node's containerd
#   hack/node.sh running      exits 0 when the node's containerd runs
#
# How it is built to leave the machine as it was:
# - Kernel settings: the kubelet sets kernel.panic=10, kernel.panic_on_oops=1 and
#   vm.overcommit_memory=1 at start, unless protectKernelDefaults is on, and then it refuses to
#   start when they differ. So containerd and the kubelet run in a private mount namespace
#   (held by a sleeping process) where the six /proc/sys files it checks are covered, read-only,
#   by files holding its values; protectKernelDefaults stays on, so a missing cover fails closed.
#   Containers see the real values. Every mount the node makes lives in that namespace and goes
#   with it.
# - Network: pods run in the node's network only (hostNetwork; the CNI config is loopback-only,
#   so other pods cannot start), the node's InternalIP is 127.0.0.1 (--hostname-override), the
#   kubelet, containerd's stream server and kube-scheduler bind 127.0.0.1, no kube-proxy, no
#   iptables chains of the kubelet's, and pods get a resolv.conf naming 127.0.0.1 only.
# - The node carries the taint sandboxd.dev/local-node=true:NoSchedule: only pods that tolerate
#   it run here (the chart's values for this node, hack/node-values.sh), not the pods of every
#   test that renders the chart into the API server.
# - This machine's root lacks CAP_SYS_RESOURCE: containerd clamps the kubelet's negative
#   oom_score_adj (restrict_oom_score_adj), or runc fails every pod sandbox.
# SANDBOXD_KUBELET_PORT moves its ports (kubelet; +1 healthz, +2 containerd's stream server).
source "$(dirname "$0")/lib.sh"

NODE_DIR="$DEV_DIR/node"
CP="$DEV_DIR/control-plane"
KUBECONFIG_FILE="$DEV_DIR/kubeconfig"
NODE_NAME=127.0.0.1
TAINT=sandboxd.dev/local-node=true:NoSchedule
KUBELET_PORT="${SANDBOXD_KUBELET_PORT:-20250}"
HEALTHZ_PORT=$((KUBELET_PORT + 1))
STREAM_PORT=$((KUBELET_PORT + 2))
# Unix sockets (containerd's, its shims') need a short path, whatever the checkout's: like
# dockerd's exec root, a folder in /run named after the checkout.
RUN_DIR="/run/sandboxd-node-$(printf '%s' "$ROOT_DIR" | sha256sum | cut -c1-8)"
SOCK="$RUN_DIR/containerd.sock"
LOGS="$NODE_DIR/logs"
# The sysctls the kubelet's setupKernelTunables checks, with the values it wants.
SYSCTLS="vm/overcommit_memory=1 vm/panic_on_oom=0 kernel/panic=10 kernel/panic_on_oops=1
kernel/keys/root_maxkeys=1000000 kernel/keys/root_maxbytes=25000000"

kubectl() { "$KUBE_BIN/kubectl" --kubeconfig "$KUBECONFIG_FILE" "$@"; }

# alive NAME: whether the process in NAME.pid runs and is ours (its command line names the node
# folder or its binary): pids wrap, and a stale pid file must not name another process.
alive() {
  local file="$NODE_DIR/$1.pid" pid
  [[ -f $file ]] || return 1
  pid=$(cat "$file")
  [[ $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) != Z ]] || return 1
  tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -qF -- "$(marker "$1")"
}
marker() {
  case $1 in
    nsholder) echo "sleep infinity" ;;
    kube-scheduler) echo "$CP/scheduler.kubeconfig" ;;
    *) echo "$NODE_DIR" ;;
  esac
}
own_namespace() { [[ $(readlink "/proc/$1/ns/mnt") != "$(readlink /proc/self/ns/mnt)" ]]; }
# in_ns COMMAND...: runs COMMAND in the node's mount namespace.
in_ns() { nsenter -t "$(cat "$NODE_DIR/nsholder.pid")" -m -- "$@"; }
ctr() { in_ns "$CONTAINERD_BIN/ctr" -a "$SOCK" -n k8s.io "$@"; }

node_ready() {
  [[ $(kubectl get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null) == True ]]
}
# The not-ready taint the node registers with is dropped by the node lifecycle controller.
node_schedulable() {
  node_ready && ! kubectl get node "$NODE_NAME" -o jsonpath='{.spec.taints[*].key}' | grep -q node.kubernetes.io/not-ready
}

configs() {
  mkdir -p "$RUN_DIR"/{s,runc} "$NODE_DIR"/{containerd,cni/net.d,cni/bin,cdi,kubelet,pod-logs,volume-plugins,sysctl-cover} "$LOGS"
  printf 'nameserver 127.0.0.1\noptions ndots:1\n' >"$NODE_DIR/resolv.conf"
  # Loopback only: with this network config the node is Ready; pods use the node's network.
  echo '{"cniVersion":"1.0.0","name":"lo-only","plugins":[{"type":"loopback"}]}' >"$NODE_DIR/cni/net.d/10-lo-only.conflist"
  cat >"$NODE_DIR/containerd.toml" <<TOML
version = 4
root = '$NODE_DIR/containerd/root'
state = '$NODE_DIR/containerd/state'
[plugins]
  [plugins.'io.containerd.server.v1.grpc']
    address = '$SOCK'
  [plugins.'io.containerd.server.v1.ttrpc']
    address = '$SOCK.ttrpc'
  [plugins.'io.containerd.shim.v1.manager']
    socket_dir = '$RUN_DIR/s'
  [plugins.'io.containerd.internal.v1.opt']
    path = '$NODE_DIR/containerd/opt'
  [plugins.'io.containerd.image-verifier.v1.bindir']
    bin_dir = '$NODE_DIR/containerd/image-verifier'
  [plugins.'io.containerd.nri.v1.nri']
    disable = true
  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = '127.0.0.1'
    stream_server_port = '$STREAM_PORT'
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = 'registry.k8s.io/pause:$PAUSE_VERSION'
  [plugins.'io.containerd.cri.v1.runtime']
    cdi_spec_dirs = ['$NODE_DIR/cdi']
    enable_criu = false
    restrict_oom_score_adj = true
    netns_mounts_under_state_dir = true
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
        runtime_path = '$CONTAINERD_BIN/containerd-shim-runc-v2'
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = '$RUNC_BIN/runc'
          Root = '$RUN_DIR/runc'
          SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ['$NODE_DIR/cni/bin']
      conf_dir = '$NODE_DIR/cni/net.d'
TOML
  cat >"$NODE_DIR/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $HEALTHZ_PORT
containerRuntimeEndpoint: unix://$SOCK
cgroupDriver: cgroupfs
# cgroup v1 (hybrid) on these machines: still allowed in $KUBERNETES_VERSION when said so.
failCgroupV1: false
failSwapOn: false
# With the sysctl cover: refuse to start rather than write kernel settings.
protectKernelDefaults: true
makeIPTablesUtilChains: false
resolvConf: $NODE_DIR/resolv.conf
podLogsDir: $NODE_DIR/pod-logs
volumePluginDir: $NODE_DIR/volume-plugins
registerWithTaints: [{key: sandboxd.dev/local-node, value: "true", effect: NoSchedule}]
# Reached only from this machine (kubectl logs and exec through the API server).
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, nodefs.inodesFree: 1%, imagefs.available: 1%}
imageGCHighThresholdPercent: 99
imageGCLowThresholdPercent: 98
serializeImagePulls: false
maxPods: 30
YAML
}

start_scheduler() {
  alive kube-scheduler && return 0
  log "node: starting kube-scheduler (log: $LOGS/kube-scheduler.log)"
  setsid "$KUBELET_BIN/kube-scheduler" \
    --kubeconfig "$CP/scheduler.kubeconfig" --authentication-kubeconfig "$CP/scheduler.kubeconfig" \
    --authorization-kubeconfig "$CP/scheduler.kubeconfig" \
    --leader-elect=false --bind-address 127.0.0.1 --secure-port 0 \
    >"$LOGS/kube-scheduler.log" 2>&1 </dev/null &
  echo $! >"$NODE_DIR/kube-scheduler.pid"
}

start_namespace() {
  alive nsholder && return 0
  setsid unshare --mount --propagation private -- sleep infinity </dev/null >/dev/null 2>&1 &
  local holder=$!
  echo "$holder" >"$NODE_DIR/nsholder.pid"
  WAIT_PID=$holder wait_for "the node's mount namespace" 10 own_namespace "$holder"
  local kv key
  for kv in $SYSCTLS; do
    key=${kv%=*}
    echo "${kv#*=}" >"$NODE_DIR/sysctl-cover/${key//\//.}"
    in_ns mount --bind "$NODE_DIR/sysctl-cover/${key//\//.}" "/proc/sys/$key"
    in_ns mount -o remount,bind,ro "/proc/sys/$key"
  done
  log "node: mount namespace held by pid $holder, kernel settings covered inside it"
}

start_containerd() {
  alive containerd && return 0
  log "node: starting containerd v$CONTAINERD_VERSION (log: $LOGS/containerd.log)"
  # nsenter execs setsid execs containerd: $! is containerd's pid, not a subshell's.
  nsenter -t "$(cat "$NODE_DIR/nsholder.pid")" -m -- setsid "$CONTAINERD_BIN/containerd" --config "$NODE_DIR/containerd.toml" \
    >>"$LOGS/containerd.log" 2>&1 </dev/null &
  echo $! >"$NODE_DIR/containerd.pid"
  WAIT_PID=$! wait_for "containerd (log: $LOGS/containerd.log)" 30 ctr version
  ctr images import "$PAUSE_DIR/pause.tar" >/dev/null 2>&1 || die "cannot import the pause image into the node (log: $LOGS/containerd.log)"
}

start_kubelet() {
  alive kubelet && return 0
  log "node: starting kubelet v$KUBERNETES_VERSION (log: $LOGS/kubelet.log)"
  nsenter -t "$(cat "$NODE_DIR/nsholder.pid")" -m -- setsid "$KUBELET_BIN/kubelet" --config "$NODE_DIR/kubelet.yaml" \
    --kubeconfig "$CP/kubelet.kubeconfig" --root-dir "$NODE_DIR/kubelet" \
    --cert-dir "$NODE_DIR/kubelet/pki" --hostname-override "$NODE_NAME" \
    >>"$LOGS/kubelet.log" 2>&1 </dev/null &
  echo $! >"$NODE_DIR/kubelet.pid"
  WAIT_PID=$! wait_for "the node to be Ready (log: $LOGS/kubelet.log)" 120 node_schedulable
}

start() {
  for bin in "$KUBELET_BIN/kubelet" "$KUBELET_BIN/kube-scheduler" "$CONTAINERD_BIN/containerd" \
    "$CONTAINERD_BIN/containerd-shim-runc-v2" "$RUNC_BIN/runc" "$PAUSE_DIR/pause.tar"; do
    [[ -e $bin ]] || die "$bin is missing: run hack/build-node.sh"
  done
  [[ -f $CP/kubelet.kubeconfig ]] || die "no control plane: run hack/control-plane.sh start"
  configs
  start_scheduler
  start_namespace
  start_containerd
  start_kubelet
  log "node: $NODE_NAME is Ready (kubelet v$KUBERNETES_VERSION, containerd v$CONTAINERD_VERSION, runc v$RUNC_VERSION)"
}

# stop_pid NAME: SIGTERM, then SIGKILL after 20 s, to the process of NAME.pid if it is ours.
stop_pid() {
  local file="$NODE_DIR/$1.pid" pid
  if alive "$1"; then
    pid=$(cat "$file")
    kill "$pid" 2>/dev/null || true
    local deadline=$((SECONDS + 20))
    while kill -0 "$pid" 2>/dev/null && [[ $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) != Z ]] && ((SECONDS < deadline)); do sleep 0.2; done
    kill -9 "$pid" 2>/dev/null || true
    log "node: stopped $1 (pid $pid)"
  fi
  rm -f "$file"
}

stop() {
  [[ -d $NODE_DIR ]] || return 0
  # The Node goes too: a kubelet started later registers it again and is waited for afresh.
  if alive kubelet; then kubectl delete node "$NODE_NAME" --wait=false >/dev/null 2>&1 || true; fi
  stop_pid kubelet
  stop_pid kube-scheduler
  if alive nsholder; then
    # The pods' containers outlive the kubelet (their shims hold them): kill and remove them.
    if alive containerd; then
      local t c
      for t in $(ctr tasks ls -q 2>/dev/null); do ctr tasks kill -s SIGKILL "$t" >/dev/null 2>&1 || true; done
      for t in $(ctr tasks ls -q 2>/dev/null); do ctr tasks rm -f "$t" >/dev/null 2>&1 || true; done
      for c in $(ctr containers ls -q 2>/dev/null); do ctr containers rm "$c" >/dev/null 2>&1 || true; done
    fi
    stop_pid containerd
    # Whatever is left in the namespace (a shim that outlived containerd) goes with it.
    local ns pids d
    ns=$(readlink "/proc/$(cat "$NODE_DIR/nsholder.pid")/ns/mnt")
    for d in /proc/[0-9]*; do
      [[ $(readlink "$d/ns/mnt" 2>/dev/null) == "$ns" && ${d#/proc/} != "$(cat "$NODE_DIR/nsholder.pid")" ]] && pids+=" ${d#/proc/}"
    done
    [[ -z ${pids:-} ]] || { log "node: killing what is left in its namespace:$pids"; kill -9 $pids 2>/dev/null || true; sleep 0.5; }
    stop_pid nsholder
  fi
  rm -f "$NODE_DIR"/*.pid
  # The pods' cgroups (the kubelet makes kubepods in every hierarchy; one node per machine):
  # a container whose shim died with containerd is still in one; then the cgroups, leaf first.
  local h procs
  procs=$(cat /sys/fs/cgroup/pids/kubepods/cgroup.procs /sys/fs/cgroup/pids/kubepods/*/cgroup.procs \
    /sys/fs/cgroup/pids/kubepods/*/*/cgroup.procs /sys/fs/cgroup/pids/kubepods/*/*/*/cgroup.procs 2>/dev/null | sort -u | tr '\n' ' ' || true)
  [[ -z ${procs// } ]] || { log "node: killing what is left in its pods' cgroups: $procs"; kill -9 $procs 2>/dev/null || true; sleep 0.5; }
  local deadline=$((SECONDS + 10))
  while ls -d /sys/fs/cgroup/*/kubepods >/dev/null 2>&1 && ((SECONDS < deadline)); do
    for h in /sys/fs/cgroup/*/kubepods; do find "$h" -depth -type d -exec rmdir {} \; 2>/dev/null || true; done
    sleep 0.2
  done
  ls -d /sys/fs/cgroup/*/kubepods >/dev/null 2>&1 && log "node: warning: cgroups left: $(ls -d /sys/fs/cgroup/*/kubepods | tr '\n' ' ')"
  # Two places the kubelet writes whatever its configuration says: our links and its socket.
  if [[ -d /var/log/containers ]]; then
    find /var/log/containers -maxdepth 1 -type l -lname "$NODE_DIR/*" -delete
    rmdir /var/log/containers 2>/dev/null || true
  fi
  rm -f /var/lib/kubelet/device-plugins/kubelet.sock
  rmdir /var/lib/kubelet/device-plugins /var/lib/kubelet 2>/dev/null || true
  # Nothing of the node is mounted any more (its namespace is gone): its state goes, the logs stay.
  if grep -qF -e " $NODE_DIR/" -e " $RUN_DIR/" /proc/self/mountinfo; then die "node: mounts under $NODE_DIR remain in the host's namespace"; fi
  find "$NODE_DIR" -mindepth 1 -maxdepth 1 ! -name logs -exec rm -rf {} +
  rm -rf "$RUN_DIR"
}

# load IMAGE…: docker save from the project's dockerd | ctr import into the node's containerd.
load() {
  alive containerd || die "the node is not running: run make up"
  export DOCKER_HOST="${DOCKER_HOST:-unix://$DEV_DIR/docker.sock}"
  local image
  for image in "$@"; do
    local err
    err=$(docker save "$image" | ctr images import - 2>&1 >/dev/null) || die "cannot load $image into the node: $err"
    log "node: loaded $image"
  done
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  load) shift; load "$@" ;;
  running) alive containerd ;;
  *) die "usage: $0 start|stop|running|load IMAGE…" ;;
esac
