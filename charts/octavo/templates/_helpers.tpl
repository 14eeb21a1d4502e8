{{/*
Chart name, at most 63 characters.
*/}}
{{- define "octavo.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name: the release name, prefixed by the chart name unless it already contains it.
*/}}
{{- define "octavo.fullname" -}}
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

{{/*
Name of the operator's Deployment, Service, ClusterRole and ClusterRoleBinding.
*/}}
{{- define "octavo.operator.fullname" -}}
{{- printf "%s-operator" (include "octavo.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Chart label value: name-version.
*/}}
{{- define "octavo.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels common to every object.
*/}}
{{- define "octavo.labels" -}}
helm.sh/chart: {{ include "octavo.chart" . }}
app.kubernetes.io/name: {{ include "octavo.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: octavo
{{- end }}

{{/*
Selector labels of the operator pods.
*/}}
{{- define "octavo.operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "octavo.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/*
Labels of the operator's objects.
*/}}
{{- define "octavo.operator.labels" -}}
{{ include "octavo.labels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{/*
Name of the operator's ServiceAccount.
*/}}
{{- define "octavo.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "octavo.operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
An image reference from {repository, tag, digest}: the digest wins, the tag defaults to appVersion.
Call with (dict "image" .Values.image "root" .).
*/}}
{{- define "octavo.imageRef" -}}
{{- if .image.digest }}
{{- printf "%s@%s" .image.repository .image.digest }}
{{- else }}
{{- printf "%s:%s" .image.repository (default .root.Chart.AppVersion .image.tag) }}
{{- end }}
{{- end }}

{{/*
The operator image.
*/}}
{{- define "octavo.operator.image" -}}
{{- include "octavo.imageRef" (dict "image" .Values.image "root" .) }}
{{- end }}

{{/*
The default model server image, handed to the operator.
*/}}
{{- define "octavo.server.image" -}}
{{- include "octavo.imageRef" (dict "image" .Values.operator.serverImage "root" .) }}
{{- end }}

{{/*
In-cluster URL of the operator's liveness endpoint.
*/}}
{{- define "octavo.operator.healthzURL" -}}
{{- printf "http://%s.%s.svc:8080/healthz" (include "octavo.operator.fullname" .) .Release.Namespace }}
{{- end }}

{{/*
A generated rule file of files/rbac/ as a YAML list, checked to be a list of PolicyRules.
Call with (dict "root" . "file" "namespaced-rules.yaml").
*/}}
{{- define "octavo.rbac.rules" -}}
{{- $path := printf "files/rbac/%s" .file }}
{{- $rules := .root.Files.Get $path | fromYamlArray }}
{{- if not $rules }}
{{- fail (printf "%s is missing or empty: it is generated from the operator's source" $path) }}
{{- end }}
{{- range $rules }}
{{- if not (kindIs "map" .) }}
{{- fail (printf "%s must be a YAML list of PolicyRule objects: %v" $path .) }}
{{- end }}
{{- end }}
{{- toYaml $rules }}
{{- end }}

{{/*
A list of strings as a CEL list literal: ['a', 'b']. The values schema keeps quotes and
backslashes out of the strings this is used for.
*/}}
{{- define "octavo.celStrings" -}}
[{{ range $i, $s := . }}{{ if $i }}, {{ end }}'{{ $s }}'{{ end }}]
{{- end }}
