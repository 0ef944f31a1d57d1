{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "brain-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Release-qualified name used for every object this chart creates. */}}
{{- define "brain-operator.fullname" -}}
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

{{- define "brain-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels: stable across upgrades, so never the version. */}}
{{- define "brain-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "brain-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The standard labels but app.kubernetes.io/component. */}}
{{- define "brain-operator.commonLabels" -}}
helm.sh/chart: {{ include "brain-operator.chart" . }}
{{ include "brain-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: brain-train
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "brain-operator.labels" -}}
{{ include "brain-operator.commonLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{/* The operator's own pods and Service: the helm test pod shares the selector labels, not the component. */}}
{{- define "brain-operator.operatorSelectorLabels" -}}
{{ include "brain-operator.selectorLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{/* An image by digest when one is given (what runs is then exactly what was built and scanned), else by tag. */}}
{{- define "brain-operator.imageRef" -}}
{{- if .image.digest -}}
{{ .image.repository }}@{{ .image.digest }}
{{- else -}}
{{ .image.repository }}:{{ .image.tag | default .appVersion }}
{{- end -}}
{{- end }}

{{- define "brain-operator.trainerImage" -}}
{{ include "brain-operator.imageRef" (dict "image" .Values.trainer.image "appVersion" .Chart.AppVersion) }}
{{- end }}

{{- define "brain-operator.image" -}}
{{ include "brain-operator.imageRef" (dict "image" .Values.image "appVersion" .Chart.AppVersion) }}
{{- end }}

{{/* Served namespaces for a namespaceSelector: all, or the watched ones. */}}
{{- define "brain-operator.namespaceSelector" -}}
{{- if .Values.rbac.clusterWide }}
any: true
{{- else }}
matchNames:
  {{- range include "brain-operator.watchNamespaces" . | fromJsonArray }}
  - {{ . }}
  {{- end }}
{{- end }}
{{- end }}

{{- define "brain-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "brain-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Namespaces watched in namespaced mode: watchNamespaces, or the release's own. */}}
{{- define "brain-operator.watchNamespaces" -}}
{{- if .Values.watchNamespaces }}
{{- toJson .Values.watchNamespaces }}
{{- else }}
{{- toJson (list .Release.Namespace) }}
{{- end }}
{{- end }}

{{/*
The rules the operator needs in every namespace it serves. tests/chart/operator_permissions.py
holds the same list, derived from what brain_operator calls; a test keeps the two equal.
*/}}
{{- define "brain-operator.namespacedRules" -}}
# Follow jobs (kopf) and patch its bookkeeping annotations; read one job.
- apiGroups: ["brain.ai"]
  resources: ["braintrainingjobs"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["brain.ai"]
  resources: ["braintrainingjobs/status"]
  verbs: ["patch"]
# Children carry owner references with blockOwnerDeletion; clusters running the
# OwnerReferencesPermissionEnforcement admission plugin require this to create them.
- apiGroups: ["brain.ai"]
  resources: ["braintrainingjobs/finalizers"]
  verbs: ["update"]
# Worker pods: created, watched for status, deleted on suspend, scale-down or retry;
# read when a create meets AlreadyExists (ours and alive?) and when the watch shows one Terminating;
# patched (kueue.x-k8s.io/retriable-in-group: "false") when a failed job ends its Kueue pod group.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "create", "delete", "patch"]
# A queued job's pod stuck Terminating on a lost node: its phase set Failed, as PodGC does, so Kueue
# counts it gone and keeps its replacement (lost_pods.py). Status only: never a pod's spec.
- apiGroups: [""]
  resources: ["pods/status"]
  verbs: ["patch"]
# Per-job children (headless Service, trainer.yaml ConfigMap, checkpoint claim):
# watched (a child deleted by hand comes back at once), recreated when missing,
# garbage-collected through owner references (a retained checkpoint claim is
# not: it outlives the job). Each kind created is read when a create meets AlreadyExists.
- apiGroups: [""]
  resources: ["services", "persistentvolumeclaims"]
  verbs: ["get", "list", "watch", "create"]
# Each job's NetworkPolicy (who may connect to its workers): watched, recreated when
# missing, garbage-collected with the job.
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "list", "watch", "create"]
# trainer.yaml: patched when a propagated spec field changes.
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "watch", "create", "patch"]
# Gang scheduling (spec.scheduling.gang): one PodGroup per job, owned by it, watched like the other children.
- apiGroups: ["scheduling.k8s.io", "scheduling.x-k8s.io", "scheduling.volcano.sh"]
  resources: ["podgroups"]
  verbs: ["get", "list", "watch", "create"]
# Kueue's Workloads: listed for the reason a queued job waits; patched (spec.active) to suspend or
# resume a queued PyTorchJob; deleted to end a pod group on suspend, resize or the job's deletion.
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads"]
  verbs: ["list", "patch", "delete"]
# Events on jobs: phase transitions, worker failures, kopf's handler progress.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- if .Values.pytorchjob.enabled }}
# backend: pytorchjob hands the workers to the Kubeflow training operator.
- apiGroups: ["kubeflow.org"]
  resources: ["pytorchjobs"]
  verbs: ["get", "list", "create", "patch"]
{{- end }}
{{- end }}

{{/*
Defaults the operator applies to jobs that omit them: the variables
brain_operator.spec.OperatorDefaults.from_env reads.
*/}}
{{- define "brain-operator.defaultsEnv" -}}
- name: BRAIN_TRAINER_IMAGE
  value: {{ include "brain-operator.trainerImage" . | quote }}
- name: BRAIN_TRAINER_IMAGE_PULL_POLICY
  value: {{ .Values.trainer.imagePullPolicy | quote }}
- name: BRAIN_NCCL_ENV
  value: {{ .Values.trainer.ncclEnv | toJson | quote }}
- name: BRAIN_TRAINER_IMAGE_PULL_SECRETS
  value: {{ .Values.trainer.imagePullSecrets | toJson | quote }}
- name: BRAIN_POD_OVERLAY_POLICY
  value: {{ .Values.podOverlayPolicy | toJson | quote }}
- name: BRAIN_NETWORK_POLICY
  value: {{ .Values.networkPolicy.enabled | toString | quote }}
- name: BRAIN_SCRAPE_NAMESPACES
  value: {{ .Values.networkPolicy.scrapeNamespaces | toJson | quote }}
# The operator polls rank 0 from here: each job's NetworkPolicy admits this namespace to the metrics port.
- name: BRAIN_OPERATOR_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
{{- end }}
