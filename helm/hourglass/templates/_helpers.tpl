{{/*
Names, labels and the pieces both roles share. Object names are DNS labels of at most 63
characters; the workloads' names stop at 52, since Kubernetes adds
"-<10-character hash>" to them in the pods' controller-revision-hash label.
*/}}

{{/* The chart's name, or nameOverride. */}}
{{- define "hourglass.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The release's full name: fullnameOverride, else RELEASE-NAME, or RELEASE alone when it
already contains the chart's name.
*/}}
{{- define "hourglass.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Name of the aggregator's StatefulSet, its client Service and ConfigMap. */}}
{{- define "hourglass.aggregator.fullname" -}}
{{- printf "%s-aggregator" (include "hourglass.fullname" .) | trunc 52 | trimSuffix "-" }}
{{- end }}

{{/* Name of the aggregator's headless Service (the StatefulSet's serviceName). */}}
{{- define "hourglass.aggregator.headlessName" -}}
{{- printf "%s-headless" (include "hourglass.aggregator.fullname" .) }}
{{- end }}

{{/* Name of the agents' DaemonSet, ConfigMap and metrics Service. */}}
{{- define "hourglass.agent.fullname" -}}
{{- printf "%s-agent" (include "hourglass.fullname" .) | trunc 52 | trimSuffix "-" }}
{{- end }}

{{/* chart label: name-version. */}}
{{- define "hourglass.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels every object carries. */}}
{{- define "hourglass.labels" -}}
helm.sh/chart: {{ include "hourglass.chart" . }}
{{ include "hourglass.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: hourglass
{{- end }}

{{/* Labels that select the release's pods (never change them: selectors are immutable). */}}
{{- define "hourglass.selectorLabels" -}}
app.kubernetes.io/name: {{ include "hourglass.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels of the aggregator's objects, and the ones selecting its pods. */}}
{{- define "hourglass.aggregator.labels" -}}
{{ include "hourglass.labels" . }}
app.kubernetes.io/component: aggregator
{{- end }}
{{- define "hourglass.aggregator.selectorLabels" -}}
{{ include "hourglass.selectorLabels" . }}
app.kubernetes.io/component: aggregator
{{- end }}

{{/* Labels of the agents' objects, and the ones selecting their pods. */}}
{{- define "hourglass.agent.labels" -}}
{{ include "hourglass.labels" . }}
app.kubernetes.io/component: agent
{{- end }}
{{- define "hourglass.agent.selectorLabels" -}}
{{ include "hourglass.selectorLabels" . }}
app.kubernetes.io/component: agent
{{- end }}

{{/* The ServiceAccount the pods run as. */}}
{{- define "hourglass.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "hourglass.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The image reference. */}}
{{- define "hourglass.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/* A listen address: listenHost and a port. */}}
{{- define "hourglass.listen" -}}
{{- printf "%s:%d" .root.Values.listenHost (int .port) }}
{{- end }}

{{/*
The URL agents ship to: agent.aggregatorUrl, else this release's aggregator Service.
*/}}
{{- define "hourglass.aggregatorUrl" -}}
{{- if .Values.agent.aggregatorUrl }}
{{- .Values.agent.aggregatorUrl }}
{{- else if .Values.aggregator.enabled }}
{{- printf "%s://%s.%s.svc:%d" (ternary "https" "http" .Values.tls.enabled) (include "hourglass.aggregator.fullname" .) .Release.Namespace (int .Values.aggregator.service.port) }}
{{- else }}
{{- fail "agent.aggregatorUrl is required when aggregator.enabled is false: agents need an aggregator to ship to" }}
{{- end }}
{{- end }}

{{/* HOURGLASS_LABELS: agent.labels as sorted, comma-separated k=v pairs. */}}
{{- define "hourglass.agent.labelList" -}}
{{- $pairs := list }}
{{- range $key, $value := .Values.agent.labels }}
{{- $pairs = append $pairs (printf "%s=%v" $key $value) }}
{{- end }}
{{- join "," $pairs }}
{{- end }}

{{/* The agents' checkpoint directory on the node. */}}
{{- define "hourglass.agent.hostDataDir" -}}
{{- .Values.agent.dataDir.hostPath | default (printf "/var/lib/hourglass-agent/%s-%s" .Release.Namespace .Release.Name) }}
{{- end }}

{{/*
A duration of the config files ("10s", "5m", "250ms") in whole seconds, rounded up.
*/}}
{{- define "hourglass.durationSeconds" -}}
{{- $text := toString . }}
{{- $number := regexFind "^[0-9]+" $text | default "0" | int64 }}
{{- $unit := regexFind "[a-z]+$" $text }}
{{- if eq $unit "ms" }}{{ div (add $number 999) 1000 }}
{{- else if eq $unit "s" }}{{ $number }}
{{- else if eq $unit "m" }}{{ mul $number 60 }}
{{- else if eq $unit "h" }}{{ mul $number 3600 }}
{{- else if eq $unit "d" }}{{ mul $number 86400 }}
{{- else }}{{ fail (printf "%q is not a duration: a whole number and ms, s, m, h or d" $text) }}
{{- end }}
{{- end }}

{{/*
TOML of a map of values, for the processes' config files. Helm reads every number in
values as a float, and `toToml` would write 256 as 256.0, which the processes' integer
fields reject; this writes whole numbers as integers. Keys with a null value are left
out (the binary's default applies). Scalars and arrays come first, then one [table] per
nested map, as TOML requires.
Arguments: dict "table" MAP "path" LIST-OF-QUOTED-KEYS.
*/}}
{{- define "hourglass.toml" -}}
{{- $path := .path }}
{{- range $key, $value := .table }}
{{- if and (not (kindIs "map" $value)) (not (kindIs "invalid" $value)) }}
{{ include "hourglass.toml.key" $key }} = {{ include "hourglass.toml.value" $value }}
{{- end }}
{{- end }}
{{- range $key, $value := .table }}
{{- if kindIs "map" $value }}
{{- $sub := append $path (include "hourglass.toml.key" $key) }}

[{{ join "." $sub }}]
{{- include "hourglass.toml" (dict "table" $value "path" $sub) }}
{{- end }}
{{- end }}
{{- end }}

{{/* A TOML key: bare when it can be, else a quoted string. */}}
{{- define "hourglass.toml.key" -}}
{{- if regexMatch "^[A-Za-z0-9_-]+$" . }}{{ . }}{{ else }}{{ toJson . }}{{ end }}
{{- end }}

{{/*
A TOML value. A JSON string is a valid TOML basic string (same escapes), and whole
floats become integers.
*/}}
{{- define "hourglass.toml.value" -}}
{{- if kindIs "bool" . }}{{ . }}
{{- else if kindIs "float64" . }}{{ if eq . (floor .) }}{{ int64 . }}{{ else }}{{ . }}{{ end }}
{{- else if or (kindIs "int" .) (kindIs "int64" .) }}{{ . }}
{{- else if kindIs "string" . }}{{ toJson . }}
{{- else if kindIs "slice" . }}
{{- $items := list }}
{{- range . }}{{ $items = append $items (include "hourglass.toml.value" .) }}{{ end }}
{{- printf "[%s]" (join ", " $items) }}
{{- else }}{{ fail (printf "cannot write %v (%s) in a TOML config file" . (kindOf .)) }}
{{- end }}
{{- end }}

{{/*
Probe timings from values (enabled is the chart's switch, not a probe field).
*/}}
{{- define "hourglass.probeTimings" -}}
{{- range $key, $value := omit . "enabled" }}
{{ $key }}: {{ int $value }}
{{- end }}
{{- end }}

{{/*
The container security context of the init container that chowns a hostPath: root, but
with nothing besides CAP_CHOWN.
*/}}
{{- define "hourglass.chownSecurityContext" -}}
runAsUser: 0
runAsNonRoot: false
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop:
    - ALL
  add:
    - CHOWN
{{- end }}

{{/*
The Secrets cluster mode mounts, as a JSON list of {name, secret, key, dir, field}: the
volume's name, the Secret and its key, the directory it is mounted at, and the [cluster]
key naming the file. Only those whose Secret is set. The StatefulSet mounts them and the
ConfigMap points at them, both from this list.
*/}}
{{- define "hourglass.aggregator.clusterSecrets" -}}
{{- $c := .Values.aggregator.cluster }}
{{- $all := list
  (dict "name" "nats-credentials" "secret" $c.credentials.existingSecret "key" $c.credentials.key "dir" "/etc/hourglass/nats" "field" "credentials")
  (dict "name" "nats-ca" "secret" $c.caSecret "key" $c.caKey "dir" "/etc/hourglass/nats-ca" "field" "ca_file")
  (dict "name" "peer-token" "secret" $c.peerToken.existingSecret "key" $c.peerToken.key "dir" "/etc/hourglass/peer-token" "field" "peer_token_file") }}
{{- if .Values.tls.enabled }}
{{- /* Nodes dial each other's gRPC over TLS, trusting the CA agents trust. */}}
{{- $all = append $all (dict "name" "peer-ca" "secret" (.Values.tls.caSecret | default .Values.tls.serverSecret) "key" "ca.crt" "dir" "/etc/hourglass/peer-ca" "field" "peer_ca_file") }}
{{- end }}
{{- $set := list }}
{{- range $all }}
{{- if .secret }}{{ $set = append $set . }}{{ end }}
{{- end }}
{{- toJson $set }}
{{- end }}

{{/*
The config file's [cluster] section from aggregator.cluster, as JSON. No node and no
advertise: they differ per pod and come from HOURGLASS_CLUSTER_NODE and
HOURGLASS_CLUSTER_ADVERTISE.
*/}}
{{- define "hourglass.aggregator.clusterTable" -}}
{{- $c := .Values.aggregator.cluster }}
{{- $table := dict "nats" $c.nats "stream" $c.stream "subject_prefix" $c.subjectPrefix "partitions" $c.partitions "replicas" $c.replicas "owners" $c.owners "max_age" $c.maxAge "publish_timeout" $c.publishTimeout "heartbeat" $c.heartbeat "member_ttl" $c.memberTtl }}
{{- if not (kindIs "invalid" $c.subjects) }}
{{- $_ := set $table "subjects" $c.subjects }}
{{- end }}
{{- range include "hourglass.aggregator.clusterSecrets" . | fromJsonArray }}
{{- $_ := set $table .field (printf "%s/%s" .dir .key) }}
{{- end }}
{{- if and .Values.tls.enabled .Values.tls.clientAuth.enabled }}
{{- /* Mutual TLS: a node presents its own serving certificate to the others. */}}
{{- $_ := set $table "peer_cert_file" "/etc/hourglass/tls/tls.crt" }}
{{- $_ := set $table "peer_key_file" "/etc/hourglass/tls/tls.key" }}
{{- end }}
{{- toJson $table }}
{{- end }}
