{{/* Names and labels. */}}
{{- define "fireflyer.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "fireflyer.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "fireflyer.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/part-of: fireflyer
{{ include "fireflyer.selectorLabels" . }}
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels of one component: call with (dict "root" $ "component" "mgmtd"). */}}
{{- define "fireflyer.selectorLabels" -}}
app.kubernetes.io/name: {{ include "fireflyer.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* The name of one component's resources: <fullname>-<component>. */}}
{{- define "fireflyer.componentName" -}}
{{ include "fireflyer.fullname" .root }}-{{ .component }}
{{- end }}

{{/* Images. */}}
{{- define "fireflyer.image" -}}
{{- $img := index .root.Values.image .which -}}
{{ .root.Values.image.registry }}{{ $img.repository }}:{{ default .root.Chart.AppVersion $img.tag }}
{{- end }}

{{/* Every mgmtd instance's gRPC address (its stable name through the headless Service), comma-separated. */}}
{{- define "fireflyer.mgmtdAddresses" -}}
{{- if .Values.kubePlay.enabled -}}
{{ .Values.kubePlay.address }}:{{ int .Values.ports.mgmtd }}
{{- else -}}
{{- $name := include "fireflyer.componentName" (dict "root" . "component" "mgmtd") -}}
{{- $addrs := list -}}
{{- range $i := until (int .Values.mgmtd.replicas) -}}
{{- $addrs = append $addrs (printf "%s-%d.%s-headless.%s.svc.%s:%d" $name $i $name $.Release.Namespace $.Values.clusterDomain (int $.Values.ports.mgmtd)) -}}
{{- end -}}
{{ join "," $addrs }}
{{- end -}}
{{- end }}

{{/* Secrets: the cluster token's, the admin token's, the database URL's. */}}
{{- define "fireflyer.clusterTokenSecret" -}}
{{- default (printf "%s-cluster-token" (include "fireflyer.fullname" .)) .Values.clusterToken.existingSecret }}
{{- end }}

{{- define "fireflyer.adminTokenSecret" -}}
{{- default (printf "%s-admin-token" (include "fireflyer.fullname" .)) .Values.admin.existingSecret }}
{{- end }}

{{- define "fireflyer.databaseSecret" -}}
{{- if and (eq .Values.database.mode "external") .Values.database.external.existingSecret -}}
{{ .Values.database.external.existingSecret }}
{{- else -}}
{{ include "fireflyer.fullname" . }}-database
{{- end }}
{{- end }}

{{- define "fireflyer.databaseSecretKey" -}}
{{- if and (eq .Values.database.mode "external") .Values.database.external.existingSecret -}}
{{ .Values.database.external.existingSecretKey }}
{{- else -}}
url
{{- end }}
{{- end }}

{{/* The pod's own names and addresses, from the downward API. */}}
{{- define "fireflyer.podEnv" -}}
- name: POD_NAME
  valueFrom: {fieldRef: {fieldPath: metadata.name}}
{{- if .Values.kubePlay.enabled }}
{{- /* podman kube play refuses status.podIP and has no nodes: the machine's address and a fixed name */}}
- name: POD_IP
  value: {{ .Values.kubePlay.address | quote }}
- name: NODE_NAME
  value: kube-play
{{- else }}
- name: POD_IP
  valueFrom: {fieldRef: {fieldPath: status.podIP}}
- name: NODE_NAME
  valueFrom: {fieldRef: {fieldPath: spec.nodeName}}
{{- end }}
{{- end }}

{{/* A service's database: DATABASE_URL from the Secret, then FF_<SERVICE>_DATABASE_URL with the service's schema
first on the search path (Kubernetes expands $(DATABASE_URL) from the variable above: the password stays in the
Secret). Call with (dict "root" $ "service" "mgmtd"). */}}
{{- define "fireflyer.databaseEnv" -}}
- name: DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "fireflyer.databaseSecret" .root }}
      key: {{ include "fireflyer.databaseSecretKey" .root }}
- name: FF_{{ upper .service }}_DATABASE_URL
  value: "$(DATABASE_URL)?options=-csearch_path%3Dfireflyer_{{ .service }}"
{{- if eq .root.Values.database.mode "external" }}
{{- with .root.Values.database.external.env }}
{{ toYaml . }}
{{- end }}
{{- end }}
{{- end }}

{{/* Extra FF_<SERVICE>_* settings from values (a map: name -> value). */}}
{{- define "fireflyer.extraEnv" -}}
{{- range $k, $v := . }}
- name: {{ $k }}
  value: {{ $v | toString | quote }}
{{- end }}
{{- end }}

{{/* The init container that makes the service's schema if missing (CREATE SCHEMA IF NOT EXISTS; it waits up to 2
minutes for the database; a race with another pod's CREATE fails it once, and the kubelet runs it again). */}}
{{- define "fireflyer.schemaInit" -}}
- name: schema
  image: {{ include "fireflyer.image" (dict "root" .root "which" "services") }}
  imagePullPolicy: {{ .root.Values.image.services.pullPolicy }}
  command:
    - {{ .root.Values.image.python }}
    - -c
    - |
      import sys, os, time
      import sqlalchemy as sa
      engine = sa.create_engine(os.environ["DATABASE_URL"], connect_args={"connect_timeout": 5})
      try:
          for attempt in range(60):  # the database may still be starting (the bundled one starts with the release)
              try:
                  with engine.begin() as conn:
                      conn.execute(sa.text('CREATE SCHEMA IF NOT EXISTS "fireflyer_{{ .service }}"'))
                  break
              except sa.exc.OperationalError as err:
                  print(f"schema fireflyer_{{ .service }}: database not reachable yet: {str(err.orig).strip()}", flush=True)
                  time.sleep(2)
          else:
              sys.exit("schema fireflyer_{{ .service }}: the database was not reachable for 2 minutes")
      finally:
          engine.dispose()
  env:
    - name: DATABASE_URL
      valueFrom:
        secretKeyRef:
          name: {{ include "fireflyer.databaseSecret" .root }}
          key: {{ include "fireflyer.databaseSecretKey" .root }}
    {{- if eq .root.Values.database.mode "external" }}
    {{- with .root.Values.database.external.env }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
    {{- end }}
  {{- with .root.Values.securityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  resources:
    requests: {cpu: 50m, memory: 128Mi}
    limits: {memory: 256Mi}
{{- end }}

{{/* The flags every service takes (ff_config.ServiceSettings). Call with (dict "root" $ "port" 8000). */}}
{{- define "fireflyer.commonArgs" -}}
{{- if .root.Values.kubePlay.enabled }}
- --listen-address={{ .root.Values.kubePlay.address }}:{{ .port }}
{{- else }}
- --listen-address=0.0.0.0:{{ .port }}
{{- end }}
- --advertise-address=$(POD_IP):{{ .port }}
{{- if .root.Values.kubePlay.enabled }}
- --metrics-address={{ .root.Values.kubePlay.address }}:{{ add .port .root.Values.kubePlay.metricsPortOffset }}
{{- else }}
- --metrics-address=0.0.0.0:{{ .root.Values.ports.metrics }}
{{- end }}
- --instance-id=$(POD_NAME)
- --cluster-token-file=/var/run/fireflyer/cluster-token/{{ .root.Values.clusterToken.key }}
- --log-level={{ .root.Values.logLevel }}
{{- end }}

{{- define "fireflyer.mgmtdClientArgs" -}}
- --mgmtd-addresses={{ include "fireflyer.mgmtdAddresses" . }}
{{- end }}

{{/* Node ids. Every pod registers with a node id of its own choosing: an id mgmtd assigns (node id 0) is the largest
taken + 1, which a storage pod added later would then find taken. StatefulSet pods: base + their ordinal (the pod
name's last part), stable across restarts (storage targets belong to their node id). Call with
(dict "root" $ "module" "ff_storage" "base" 1000). */}}
{{- define "fireflyer.ordinalCommand" -}}
{{- include "fireflyer.kubePlayExpand" .root }}
- /bin/sh
- -c
- exec {{ .root.Values.image.python }} -m {{ .module }} --node-id="$$(({{ .base }} + $${POD_NAME##*-}))" "$$@"
- {{ .module }}
{{- end }}

{{/* Pods without an ordinal (meta's, the agents'): base + the CRC-32 (cksum) of a name modulo span: the pod's name
for meta, the node's for an agent (so an agent keeps its id across restarts). Call with
(dict "root" $ "module" "ff_agent" "base" 1000000000 "span" 1000000000 "var" "NODE_NAME"). */}}
{{- define "fireflyer.hashedCommand" -}}
{{- include "fireflyer.kubePlayExpand" .root }}
- /bin/sh
- -c
- exec {{ .root.Values.image.python }} -m {{ .module }} --node-id="$$(({{ .base }} + $$(printf %s "$${{ "{" }}{{ .var }}}" | cksum | cut -d' ' -f1) % {{ .span }}))" "$$@"
- {{ .module }}
{{- end }}

{{/* A service run as `python -m <module>`. Call with (dict "root" $ "module" "ff_scheduler"). */}}
{{- define "fireflyer.moduleCommand" -}}
{{- include "fireflyer.kubePlayExpand" .root }}
- {{ .root.Values.image.python }}
- -m
- {{ .module }}
{{- end }}

{{/* kubePlay: what the kubelet does and podman kube play does not, before the container's own command: Kubernetes'
expansion of $(VAR) (a defined variable's value) and $$ (a $) in the command, the arguments and the environment's
values. Empty otherwise. */}}
{{- define "fireflyer.kubePlayExpand" -}}
{{- if .Values.kubePlay.enabled }}
- {{ .Values.image.python }}
- -c
- |
  import os, re, sys
  ref = re.compile(r"[$][$]|[$][(]([A-Za-z_][A-Za-z0-9_]*)[)]")
  def expand(text):
      return ref.sub(lambda m: "$" if m.group(1) is None else os.environ.get(m.group(1), m.group(0)), text)
  env = {k: expand(v) for k, v in os.environ.items()}
  os.execvpe(sys.argv[1], [expand(a) for a in sys.argv[1:]], env)
{{- end }}
{{- end }}

{{/* gRPC health probes on the service's port. */}}
{{- define "fireflyer.grpcProbes" -}}
{{- $p := .root.Values.probes -}}
startupProbe:
  grpc: {port: {{ .port }}}
  periodSeconds: {{ $p.startup.periodSeconds }}
  timeoutSeconds: {{ $p.startup.timeoutSeconds }}
  failureThreshold: {{ $p.startup.failureThreshold }}
readinessProbe:
  grpc: {port: {{ .port }}}
  periodSeconds: {{ $p.readiness.periodSeconds }}
  timeoutSeconds: {{ $p.readiness.timeoutSeconds }}
  failureThreshold: {{ $p.readiness.failureThreshold }}
livenessProbe:
  grpc: {port: {{ .port }}}
  periodSeconds: {{ $p.liveness.periodSeconds }}
  timeoutSeconds: {{ $p.liveness.timeoutSeconds }}
  failureThreshold: {{ $p.liveness.failureThreshold }}
{{- end }}

{{/* The cluster token, mounted read-only (services read the file at each use). */}}
{{- define "fireflyer.tokenVolume" -}}
{{- if .Values.kubePlay.enabled }}
{{- /* podman 4.3's kube play fails on secret volumes */}}
- name: cluster-token
  hostPath: {path: {{ .Values.kubePlay.tokenDir | quote }}, type: Directory}
{{- else }}
- name: cluster-token
  secret:
    secretName: {{ include "fireflyer.clusterTokenSecret" . }}
    defaultMode: 0400
{{- end }}
{{- end }}

{{- define "fireflyer.tokenMount" -}}
- name: cluster-token
  mountPath: /var/run/fireflyer/cluster-token
  readOnly: true
{{- end }}

{{/* mgmtd's admin token (admin.create): a volume of the Secret (kubePlay: a folder on the machine), mounted read-only,
and the settings that make mgmtd import it at start. Only mgmtd mounts it. */}}
{{- define "fireflyer.adminTokenVolume" -}}
{{- if .Values.admin.create }}
{{- if .Values.kubePlay.enabled }}
- name: admin-token
  hostPath: {path: {{ .Values.kubePlay.adminTokenDir | quote }}, type: Directory}
{{- else }}
- name: admin-token
  secret:
    secretName: {{ include "fireflyer.adminTokenSecret" . }}
    defaultMode: 0400
{{- end }}
{{- end }}
{{- end }}

{{- define "fireflyer.adminTokenMount" -}}
{{- if .Values.admin.create }}
- name: admin-token
  mountPath: /var/run/fireflyer/admin-token
  readOnly: true
{{- end }}
{{- end }}

{{- define "fireflyer.adminTokenEnv" -}}
{{- if .Values.admin.create }}
- name: FF_MGMTD_BOOTSTRAP_ADMIN_TOKEN_FILE
  value: {{ printf "/var/run/fireflyer/admin-token/%s" .Values.admin.key | quote }}
- name: FF_MGMTD_BOOTSTRAP_ADMIN_USER
  value: {{ .Values.admin.user | quote }}
{{- end }}
{{- end }}

{{/* Pod-level settings every service pod shares: no service-link variables (a Service named like
<release>-mgmtd would put FF_MGMTD_SERVICE_HOST in the environment, which the service refuses as an unknown
setting), pull secrets, security context. */}}
{{- define "fireflyer.podCommon" -}}
enableServiceLinks: false
{{- if .Values.kubePlay.enabled }}
hostNetwork: true
{{- /* podman 4.3 gives init containers the pod's policy: with Always, a finished schema step starts again and the
pod fails to come up */}}
restartPolicy: OnFailure
{{- end }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* The metrics port of every service container. */}}
{{- define "fireflyer.metricsPort" -}}
- name: metrics
  containerPort: {{ .Values.ports.metrics }}
  protocol: TCP
{{- end }}

{{/* Scheduling fields of one component's pod spec. Call with the component's values. */}}
{{- define "fireflyer.scheduling" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Checks of values that the schema cannot express. */}}
{{- define "fireflyer.validate" -}}
{{- if .Values.kubePlay.enabled }}
{{- if ne .Values.database.mode "external" }}
{{- fail "kubePlay needs database.mode external (podman kube play runs no StatefulSet)" }}
{{- end }}
{{- range $c := list "mgmtd" "meta" "storage" }}
{{- if ne (int (index $.Values $c).replicas) 1 }}
{{- fail (printf "kubePlay runs one %s (its pods share the machine's ports): set %s.replicas 1" $c $c) }}
{{- end }}
{{- end }}
{{- end }}
{{- if and (eq .Values.database.mode "external") (not .Values.database.external.url) (not .Values.database.external.existingSecret) }}
{{- fail "database.mode external needs database.external.url or database.external.existingSecret" }}
{{- end }}
{{- if lt (int .Values.storage.replicas) (int .Values.storage.chains.replication) }}
{{- fail (printf "storage.replicas (%d) must be at least storage.chains.replication (%d): each chain's replicas sit on different storage pods" (int .Values.storage.replicas) (int .Values.storage.chains.replication)) }}
{{- end }}
{{- end }}
