{{/* Name of every object of the release. */}}
{{- define "saferollout.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains "saferollout" .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-saferollout" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "saferollout.selectorLabels" -}}
app.kubernetes.io/name: saferollout-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "saferollout.labels" -}}
{{ include "saferollout.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: saferollout
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "saferollout.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "saferollout.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "saferollout.leaseName" -}}
{{- default (include "saferollout.fullname" .) .Values.leaderElection.leaseName -}}
{{- end -}}

{{- define "saferollout.leaseNamespace" -}}
{{- default .Release.Namespace .Values.leaderElection.namespace -}}
{{- end -}}

{{- define "saferollout.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* The subject every binding grants to. */}}
{{- define "saferollout.subject" -}}
- kind: ServiceAccount
  name: {{ include "saferollout.serviceAccountName" . }}
  namespace: {{ .Release.Namespace }}
{{- end -}}
