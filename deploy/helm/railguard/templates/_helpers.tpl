{{/* The image of `component` (collector or agent): its own tag, else the release's. */}}
{{- define "railguard.image" -}}
{{- $own := (index .root.Values .component).imageTag -}}
{{ .root.Values.image.registry }}/railguard-{{ .component }}:{{ $own | default .root.Values.image.tag | default .root.Chart.AppVersion }}
{{- end }}

{{/* Labels every object carries. */}}
{{- define "railguard.labels" -}}
app.kubernetes.io/part-of: railguard
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end }}

{{/* The collector's Service names, which its certificate and Host check carry. */}}
{{- define "railguard.collectorHosts" -}}
collector.{{ .Release.Namespace }}.svc,collector.{{ .Release.Namespace }}.svc.cluster.local
{{- end }}
