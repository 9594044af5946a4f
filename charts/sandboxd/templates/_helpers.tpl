{{/* The release's base name. */}}
{{- define "sandboxd.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "sandboxd.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "sandboxd.operatorSelector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "sandboxd.sandboxdSelector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: sandboxd
{{- end -}}

{{/* image REPOSITORY: registry prefix, the tag defaulting to the appVersion. */}}
{{- define "sandboxd.image" -}}
{{- $root := index . 0 -}}{{- $img := index . 1 -}}
{{- $repo := $img.repository -}}
{{- if $root.Values.image.registry -}}{{- $repo = printf "%s/%s" (trimSuffix "/" $root.Values.image.registry) $img.repository -}}{{- end -}}
{{- printf "%s:%s" $repo (default $root.Chart.AppVersion $img.tag) -}}
{{- end -}}

{{- define "sandboxd.tokenSecret" -}}
{{- default (printf "%s-admin-token" (include "sandboxd.fullname" .)) .Values.adminToken.existingSecret -}}
{{- end -}}

{{/* The ConfigMap of node token hashes: the operator writes, the sandboxd pods read. */}}
{{- define "sandboxd.nodeTokenHashes" -}}
{{- printf "%s-node-token-hashes" (include "sandboxd.fullname" .) -}}
{{- end -}}

{{/* "true" when each node gets its own certificate from the operator's signer: TLS on and
  no tls.existingSecret (the default), or an issuer CA named. Empty otherwise. */}}
{{- define "sandboxd.issuer" -}}
{{- if and .Values.tls.enabled (or .Values.tls.issuer.caSecret (not .Values.tls.existingSecret)) -}}true{{- end -}}
{{- end -}}

{{/* The signer's CA Secret: tls.issuer.caSecret, else the one the operator makes. */}}
{{- define "sandboxd.caSecret" -}}
{{- default (printf "%s-node-ca" (include "sandboxd.fullname" .)) .Values.tls.issuer.caSecret -}}
{{- end -}}

{{/* The Secret with the CA certificate (and, for tls.existingSecret, sandboxd's own), when TLS is on. */}}
{{- define "sandboxd.tlsSecret" -}}
{{- if include "sandboxd.issuer" . -}}
{{- include "sandboxd.caSecret" . -}}
{{- else -}}
{{- .Values.tls.existingSecret -}}
{{- end -}}
{{- end -}}

{{/* The key of the CA certificate in the Secret named by sandboxd.tlsSecret. */}}
{{- define "sandboxd.tlsCaKey" -}}
{{- if include "sandboxd.issuer" . }}tls.crt{{ else }}ca.crt{{ end -}}
{{- end -}}

{{/* The sandboxd container's environment, shared by the DaemonSet and the prepare hook. */}}
{{- define "sandboxd.tracingEnv" -}}
{{- with .Values.tracing.otlpEndpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ . | quote }}
- name: OTEL_TRACES_SAMPLER
  value: {{ $.Values.tracing.sampler | quote }}
{{- end }}
{{- end }}

{{- define "sandboxd.env" -}}
{{- /* No master and no token: only the hash of this node's token, from the operator's
  ConfigMap (the file named after the node), read again when it changes. */}}
- name: SANDBOXD_NODE_TOKEN_HASHES
  value: /etc/sandboxd-node-tokens
{{- /* On the node's address only (the one the operator dials: with hostNetwork the pod IP is
  the node's), not every interface of the node; sandboxd.listenAddress overrides it. */}}
- name: SANDBOXD_HOST
{{- with .Values.sandboxd.listenAddress }}
  value: {{ . | quote }}
{{- else }}
  valueFrom:
    fieldRef: {fieldPath: status.hostIP}
{{- end }}
- name: SANDBOXD_PORT
  value: {{ .Values.sandboxd.port | quote }}
- name: SANDBOXD_RUNTIMES_FILE
  value: /etc/sandboxd/runtimes.json
- name: SANDBOXD_WORKSPACE_ROOT
  value: {{ .Values.sandboxd.workspaceRoot | quote }}
- name: SANDBOXD_STATE_DIR
  value: {{ .Values.sandboxd.stateDir | quote }}
- name: DOCKER_HOST
  value: {{ include "sandboxd.dockerHost" . }}
- name: SANDBOXD_MAX_SESSIONS
  value: {{ .Values.sandboxd.maxSessions | quote }}
- name: SANDBOXD_MAX_SESSIONS_PER_TENANT
  value: {{ .Values.sandboxd.maxSessionsPerTenant | quote }}
- name: SANDBOXD_EXECUTE_TIMEOUT
  value: {{ .Values.sandboxd.executeTimeout | quote }}
- name: SANDBOXD_MEM_LIMIT
  value: {{ .Values.sandboxd.memLimit | quote }}
- name: SANDBOXD_WORKSPACE_SIZE
  value: {{ .Values.sandboxd.workspaceSize | quote }}
- name: SANDBOXD_WORKSPACE_QUOTA
  value: {{ .Values.sandboxd.workspaceQuota | quote }}
- name: SANDBOXD_CPUS
  value: {{ .Values.sandboxd.cpus | quote }}
- name: SANDBOXD_PIDS_LIMIT
  value: {{ .Values.sandboxd.pidsLimit | quote }}
- name: OPERATION_RETENTION_DAYS
  value: {{ .Values.sandboxd.auditRetentionDays | quote }}
{{- with .Values.sandboxd.ociRuntime }}
- name: SANDBOXD_OCI_RUNTIME
  value: {{ . | quote }}
{{- end }}
{{- with .Values.sandboxd.auditDatabaseSecret }}
- name: SANDBOXD_AUDIT_DATABASE_URL
  valueFrom:
    secretKeyRef: {name: {{ . }}, key: url}
{{- end }}
{{- /* The object store of snapshots (kubectl sandbox snapshot and fork, spec.from), the same
  for every node: a workspace snapshotted on one opens on any other. */}}
{{- with .Values.snapshots.store }}
{{- if .endpoint }}
- name: SANDBOXD_S3_ENDPOINT
  value: {{ .endpoint | quote }}
- name: SANDBOXD_S3_BUCKET
  value: {{ required "snapshots.store.bucket is required with snapshots.store.endpoint: the bucket snapshots are kept in" .bucket | quote }}
- name: SANDBOXD_S3_REGION
  value: {{ .region | quote }}
- name: SANDBOXD_S3_PREFIX
  value: {{ .prefix | quote }}
{{- with .credentialsSecret }}
- name: SANDBOXD_S3_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef: {name: {{ . }}, key: accessKeyId}
- name: SANDBOXD_S3_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef: {name: {{ . }}, key: secretAccessKey}
{{- end }}
{{- end }}
{{- end }}
- name: SANDBOXD_SNAPSHOT_GRACE
  value: {{ .Values.snapshots.graceSeconds | quote }}
- name: SANDBOXD_INSTANCE
  valueFrom:
    fieldRef: {fieldPath: spec.nodeName}
{{- /* The admin token it accepts is its node's, whose hash is in the file of this name, and
  discovery sets the node's SandboxHost spec.node from the same spec.nodeName. */}}
- name: SANDBOXD_NODE_NAME
  valueFrom:
    fieldRef: {fieldPath: spec.nodeName}
- name: SANDBOXD_IPTABLES
  value: {{ .Values.sandboxd.iptables | quote }}
- name: SANDBOXD_NETWORK_DENY
  value: {{ .Values.sandboxd.networkDeny | quote }}
- name: SANDBOXD_EGRESS_RESOLVER
  value: {{ .Values.sandboxd.egressResolver | quote }}
- name: RUST_LOG
  value: {{ .Values.sandboxd.logLevel | quote }}
{{- end -}}

{{/* DOCKER_HOST inside the pods: the socket in the mounted folder of the node's socket. The
  folder is mounted, not the socket file: a dockerd restart makes a new socket, which a mount of
  the file would never show (the pod would keep the old, dead one). */}}
{{- define "sandboxd.dockerHost" -}}
unix:///var/run/sandboxd-docker/{{ base .Values.sandboxd.dockerSocket }}
{{- end -}}

{{/* The sandboxd container's volumes: the Docker socket's folder (read-only: a socket is
  connected to, never written, so nothing else there can be changed), the workspace root at its
  host path, the state. */}}
{{- define "sandboxd.volumeMounts" -}}
- {name: docker-socket, mountPath: /var/run/sandboxd-docker, readOnly: true}
- name: workspaces
  mountPath: {{ .Values.sandboxd.workspaceRoot | quote }}
  {{- if eq .Values.sandboxd.workspaceQuota "loop" }}
  # The workspace disks sandboxd mounts must reach the host, where dockerd bind-mounts them.
  mountPropagation: Bidirectional
  {{- end }}
- {name: state, mountPath: {{ .Values.sandboxd.stateDir | quote }}}
- {name: runtimes, mountPath: /etc/sandboxd, readOnly: true}
- {name: node-token-hashes, mountPath: /etc/sandboxd-node-tokens, readOnly: true}
{{- end -}}
{{- define "sandboxd.volumes" -}}
- name: docker-socket
  hostPath: {path: {{ dir .Values.sandboxd.dockerSocket | quote }}, type: Directory}
- name: workspaces
  hostPath: {path: {{ .Values.sandboxd.workspaceRoot | quote }}, type: DirectoryOrCreate}
- name: state
  hostPath: {path: {{ .Values.sandboxd.stateDir | quote }}, type: DirectoryOrCreate}
- name: runtimes
  configMap: {name: {{ include "sandboxd.fullname" . }}-runtimes}
- name: node-token-hashes
  configMap: {name: {{ include "sandboxd.nodeTokenHashes" . }}}
{{- end -}}

{{/* The runtimes sandboxd starts with and the prepare hook builds, in the catalog format: the
  shipped catalog (when runtimes.install) and runtimes.extra. The catalog file as it is when
  there are no extra ones. */}}
{{- define "sandboxd.runtimesJson" -}}
{{- if not .Values.runtimes.extra -}}
{{- if .Values.runtimes.install -}}{{ .Files.Get "files/runtimes.json" }}{{- else -}}[]{{- end -}}
{{- else -}}
{{- $all := list -}}
{{- if .Values.runtimes.install -}}{{- $all = .Files.Get "files/runtimes.json" | fromJsonArray -}}{{- end -}}
{{- $keys := dict "description" "description" "image" "image" "baseImage" "base_image" "setupCommands" "setup_commands" "packages" "packages" "envVars" "env_vars" "briefing" "briefing" "memLimit" "mem_limit" "workspaceSize" "workspace_size" "needsNetwork" "needs_network" -}}
{{- range .Values.runtimes.extra -}}
{{- $entry := dict "alias" .name -}}
{{- range $camel, $value := .spec -}}
{{- with get $keys $camel -}}{{- $_ := set $entry . $value -}}{{- end -}}
{{- end -}}
{{- $all = append $all $entry -}}
{{- end -}}
{{- toPrettyJson $all -}}
{{- end -}}
{{- end -}}

{{/* The labels of operator.selector (`k=v,k2=v2`), as YAML lines. */}}
{{- define "sandboxd.selectorLabels" -}}
{{- $lines := list -}}
{{- range $pair := splitList "," .Values.operator.selector -}}
{{- $kv := splitList "=" (trim $pair) -}}
{{- if eq (len $kv) 2 -}}
{{- $lines = append $lines (printf "%s: %s" (index $kv 0) (index $kv 1 | quote)) -}}
{{- end -}}
{{- end -}}
{{- join "\n" $lines -}}
{{- end -}}
