{{/*
Whether the cluster serves the Prometheus Operator's API (monitoring.coreos.com/v1). `helm install` and
`helm upgrade` ask the cluster; `helm template` knows only what --api-versions names, so there
`--api-versions monitoring.coreos.com/v1` (or .../v1/ServiceMonitor) turns the monitoring objects on.
*/}}
{{- define "ornith.hasMonitoringAPI" -}}
{{- $apis := .Capabilities.APIVersions }}
{{- if or ($apis.Has "monitoring.coreos.com/v1/ServiceMonitor") ($apis.Has "monitoring.coreos.com/v1") }}true{{ end }}
{{- end }}

{{/*
Whether the cluster serves the Prometheus Operator's AlertmanagerConfig (monitoring.coreos.com/v1alpha1),
asked as for ornith.hasMonitoringAPI: `helm template` needs --api-versions monitoring.coreos.com/v1alpha1.
*/}}
{{- define "ornith.hasAlertmanagerConfigAPI" -}}
{{- $apis := .Capabilities.APIVersions }}
{{- if or ($apis.Has "monitoring.coreos.com/v1alpha1/AlertmanagerConfig") ($apis.Has "monitoring.coreos.com/v1alpha1") }}true{{ end }}
{{- end }}

{{/*
Whether the cluster serves the LeaderWorkerSet API (leaderworkerset.x-k8s.io/v1), which engine.nodes > 1
needs; asked as for ornith.hasMonitoringAPI: `helm template` needs --api-versions leaderworkerset.x-k8s.io/v1.
*/}}
{{- define "ornith.hasLeaderWorkerSetAPI" -}}
{{- $apis := .Capabilities.APIVersions }}
{{- if or ($apis.Has "leaderworkerset.x-k8s.io/v1/LeaderWorkerSet") ($apis.Has "leaderworkerset.x-k8s.io/v1") }}true{{ end }}
{{- end }}
