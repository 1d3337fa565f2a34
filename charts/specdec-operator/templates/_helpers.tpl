{{/*
Names and labels shared by every template.
*/}}

{{- define "specdec-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: <release>-<chart>, or the release name when it already contains the chart name. */}}
{{- define "specdec-operator.fullname" -}}
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

{{- define "specdec-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "specdec-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "specdec-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "specdec-operator.labels" -}}
helm.sh/chart: {{ include "specdec-operator.chart" . }}
{{ include "specdec-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: specdec-operator
{{- end }}

{{- define "specdec-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "specdec-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name must name an existing ServiceAccount when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The operator image: repository@digest when a digest is given, else repository:tag (tag defaults to appVersion). */}}
{{- define "specdec-operator.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{- define "specdec-operator.peeringName" -}}
{{- default (include "specdec-operator.fullname" .) .Values.peering.name }}
{{- end }}

{{/* Namespaces served in namespaced mode: watch.namespaces, or the release namespace. */}}
{{- define "specdec-operator.watchedNamespaces" -}}
{{- if .Values.watch.namespaces }}
{{- toJson (.Values.watch.namespaces | uniq) }}
{{- else }}
{{- toJson (list .Release.Namespace) }}
{{- end }}
{{- end }}

{{/*
RBAC rules for the namespaced objects the operator reads and writes. Shared by the ClusterRole (cluster-wide
mode) and the per-namespace Roles (namespaced mode), so both modes grant exactly the same verbs.
This is what the operator was measured to use (tests/cluster/test_chart.py runs it under this ServiceAccount through a
recording proxy, and fails on any refused request and on any grant it never used); `kubectl auth can-i` proves
each rule and that nothing else (Secrets, wildcards, other resources) is granted.
*/}}
{{- define "specdec-operator.namespacedRules" -}}
# The custom resources: watched by Kopf, which patches them for its finalizer and progress annotations.
- apiGroups: ["specdec.io"]
  resources: ["speculativeservers"]
  verbs: ["list", "watch", "patch"]
# Phase, conditions, probe results (merge patches of the status subresource).
- apiGroups: ["specdec.io"]
  resources: ["speculativeservers/status"]
  verbs: ["patch"]
{{- if .Values.rbac.ownerReferencesPermissionEnforcement }}
# The children's owner references block their owner's deletion; with the OwnerReferencesPermissionEnforcement
# admission plugin (OpenShift) setting that needs update on the owner's finalizers.
- apiGroups: ["specdec.io"]
  resources: ["speculativeservers/finalizers"]
  verbs: ["update"]
{{- end }}
# <name>-base and <name>-spec, owned by their SpeculativeServer: server-side apply (a patch, authorized as
# create when it creates), a read before taking a name, Kopf's label-filtered watch. Delete: only when
# resources.nodes changes between 1 and more, of the ones it owns (owner reference, labels, uid precondition) once
# LeaderWorkerSets replace them; otherwise the garbage collector removes them through their owner references.
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Multi-node servers (resources.nodes > 1): <name>-base and <name>-spec as LeaderWorkerSets
# (sigs.k8s.io/lws), applied, read and watched like the Deployments, deleted like them when resources.nodes goes
# back to 1; unused in a cluster without that CRD.
- apiGroups: ["leaderworkerset.x-k8s.io"]
  resources: ["leaderworkersets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# <name>-base, <name>-spec and the stable <name>, whose selector is the promotion and the rollback; with
# spec.retraining.capture, <name>-serving (where the capture proxies send the traffic), deleted when capture is
# turned off (owned, uid precondition).
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# spec.retraining.capture: the claim <name>-capture holding the captured records, owned by its SpeculativeServer,
# server-side applied with the capture proxy (read before taking the name) and deleted when capture is turned off,
# which deletes the records. Not listed or watched; the operator mounts no claim and reads no record.
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["get", "create", "patch", "delete"]
# spec.retraining.training's Jobs <name>-train-<n>, owned by their SpeculativeServer: watched through a label-filtered
# index (their state goes to status.retraining.training), read before taking the name, server-side applied once when
# one starts. Never updated or deleted by the operator: the garbage collector removes them with their resource.
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "patch"]
# <name>-adaptive, owned by its SpeculativeServer: the --speculative-adaptive-config table of load-aware
# speculation, server-side applied, read before taking the name, watched through Kopf's label-filtered index.
# <name>-probe-evidence, owned by it too: what a running probe has measured (a restarted operator resumes it),
# applied after each round, read when a probe starts, deleted once the decision is in status.
# Also get of a workload's prompt dataset (rollout.workloads[].prompts.source ConfigMap) when its probe starts: the
# watch is filtered to the operator's own label, so no other ConfigMap is cached.
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Kopf's watch of the server pods: readiness, load time, the validator init container's termination message.
# create and delete: the reader pod of a File prompt dataset (rollout.workloads[].prompts.source File), owned by
# its SpeculativeServer, started when a probe starts and deleted once the dataset is read; it is found by a
# list with a name field selector (no get, no exec, no logs).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch", "create", "delete"]
# An Event for every decision (Kopf posts core/v1 Events); list: the Warning Events about its own pods while a
# server waits, where the kubelet says why a volume does not mount (FailedMount), which pod status never says.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "list"]
{{- end }}

{{/* Peering rules (namespaced or cluster-scoped peering resource). */}}
{{- define "specdec-operator.peeringRules" -}}
{{- if .root.Values.peering.enabled -}}
# Kopf peering: watch the peers (the chart creates the peering object) ...
- apiGroups: ["kopf.dev"]
  resources: [{{ .resource | quote }}]
  verbs: ["list", "watch"]
# ... and write this replica's keep-alive into that one object only.
- apiGroups: ["kopf.dev"]
  resources: [{{ .resource | quote }}]
  resourceNames: [{{ include "specdec-operator.peeringName" .root | quote }}]
  verbs: ["patch"]
{{- end }}
{{- end }}
