{{/* Names and labels. */}}
{{- define "ornith.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "ornith.fullname" -}}
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

{{/* Name of the engine workload and of its Service (kept short: LeaderWorkerSet pod names add suffixes). */}}
{{- define "ornith.engineName" -}}
{{- printf "%s-engine" (include "ornith.fullname" .) | trunc 52 | trimSuffix "-" }}
{{- end }}

{{- define "ornith.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ornith.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "ornith.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "ornith.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: ornith-stack
ornith.ai/profile: {{ .Values.profile | quote }}
{{- end }}

{{/* Metadata of an engine pod (Deployment, LeaderWorkerSet leader or worker): the chart's labels, the
component and role, engine.podLabels and engine.podAnnotations. Called with (dict "root" . "role" ROLE). */}}
{{- define "ornith.enginePodMetadata" -}}
labels:
  {{- include "ornith.labels" .root | nindent 2 }}
  app.kubernetes.io/component: engine
  ornith.ai/role: {{ .role }}
  {{- with .root.Values.engine.podLabels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with .root.Values.engine.podAnnotations }}
annotations: {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{- define "ornith.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "ornith.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* An image reference from {repository, tag, digest, dockerfile}: [registry/]name[:tag][@sha256:digest]. A
digest pins the image by itself; without one the tag is required and never "latest". An image with a
dockerfile is one this project builds and no registry publishes: it is pulled from projectImages.registry,
and without one the chart stops, naming the commands that build and push it. Called with
(dict "root" $ "image" IMAGE "key" KEY). */}}
{{- define "ornith.image" -}}
{{- $repository := required (printf "%s.repository is required (generated values-<profile>.yaml sets it)" .key) .image.repository }}
{{- if get .image "dockerfile" }}
{{- $registry := trimSuffix "/" (.root.Values.projectImages.registry | default "") }}
{{- if not $registry }}
{{- fail (include "ornith.projectImagesMissing" .root) }}
{{- end }}
{{- $repository = printf "%s/%s" $registry $repository }}
{{- end }}
{{- $digest := .image.digest | default "" }}
{{- $tag := .image.tag | default "" }}
{{- if not $digest }}
{{- $tag = required (printf "%s.tag is required: pin a version (or a digest)" .key) .image.tag }}
{{- end }}
{{- if eq $tag "latest" }}
{{- fail (printf "%s.tag is \"latest\": pin a version tag" .key) }}
{{- end }}
{{- $repository }}{{ if $tag }}:{{ $tag }}{{ end }}{{ if $digest }}@{{ $digest }}{{ end }}
{{- end }}

{{/* Why the chart stops when projectImages.registry is empty: every image this project builds that the
release runs, with the commands that build and push it, and the values that leave it out. */}}
{{- define "ornith.projectImagesMissing" -}}
{{- $v := .Values }}
{{- $steps := list }}
{{- $without := list }}
{{- range $use := list (list $v.engine.image true "") (list $v.exporter.image $v.exporter.enabled "exporter.enabled") (list $v.gateway.image $v.gateway.enabled "gateway.enabled") }}
{{- $image := index $use 0 }}
{{- if and (index $use 1) (get $image "dockerfile") }}
{{- $ref := printf "REGISTRY/%s:%s" $image.repository $image.tag }}
{{- $steps = append $steps (printf "`docker build -f %s -t %s . && docker push %s`" $image.dockerfile $ref $ref) }}
{{- with index $use 2 }}
{{- $without = append $without (printf "--set %s=false" .) }}
{{- end }}
{{- end }}
{{- end }}
{{- printf "projectImages.registry is empty, but this release runs images that this project builds and no registry publishes: from a checkout of ornith-stack, run %s, then install with --set projectImages.registry=REGISTRY" (join " and " $steps) }}
{{- with $without }}{{ printf " (or leave out those that can be: %s)" (join " " .) }}{{ end }}
{{- end }}

{{- define "ornith.engineImage" -}}
{{- include "ornith.image" (dict "root" . "image" .Values.engine.image "key" "engine.image") }}
{{- end }}

{{- define "ornith.downloadImage" -}}
{{- if .Values.modelCache.download.image.repository }}
{{- include "ornith.image" (dict "root" . "image" .Values.modelCache.download.image "key" "modelCache.download.image") }}
{{- else }}
{{- include "ornith.engineImage" . }}
{{- end }}
{{- end }}

{{/* Whether engine pods wait for (and the chart runs) the download Job. */}}
{{- define "ornith.downloads" -}}
{{- if and .Values.modelCache.enabled .Values.modelCache.download.enabled }}true{{ end }}
{{- end }}

{{- define "ornith.modelRepo" -}}
{{- required (printf "model.repo is required for profile %q: its seed does not name the model repository; pass --set model.repo=OWNER/NAME" .Values.profile) .Values.model.repo }}
{{- end }}

{{/* The download's identity: a new repository or revision makes a new Job and a new marker file. */}}
{{- define "ornith.downloadKey" -}}
{{- printf "%s@%s %s@%s" (include "ornith.modelRepo" .) .Values.model.revision .Values.draft.repo .Values.draft.revision | sha256sum | trunc 12 }}
{{- end }}

{{- define "ornith.downloadMarker" -}}
{{- printf "%s/.ornith/%s.done" .Values.modelCache.mountPath (include "ornith.downloadKey" .) }}
{{- end }}

{{- define "ornith.cacheClaim" -}}
{{- default (printf "%s-model-cache" (include "ornith.fullname" .)) .Values.modelCache.existingClaim }}
{{- end }}

{{/* Exporter placement: "deployment" or "sidecar" (see exporter.mode). */}}
{{- define "ornith.exporterMode" -}}
{{- if eq .Values.exporter.mode "auto" }}
{{- if and (eq (int .Values.engine.nodes) 1) (gt (int .Values.engine.replicas) 1) }}sidecar{{ else }}deployment{{ end }}
{{- else }}
{{- .Values.exporter.mode }}
{{- end }}
{{- end }}

{{/* The exporter's flags; `targets` is a list of engine base URLs. */}}
{{- define "ornith.exporterArgs" -}}
{{- $args := list }}
{{- range .targets }}
{{- $args = append (append $args "--target") . }}
{{- end }}
{{- /* A sidecar's engine is http://127.0.0.1:PORT in every replica: its `target` label is the pod's name. */}}
{{- if .podName }}
{{- $args = concat $args (list "--target-name" "$(ORNITH_POD_NAME)") }}
{{- end }}
{{- $args = concat $args (list "--profile" .root.Values.profile "--listen" (printf ":%d" (int .root.Values.exporter.port))) }}
{{- if .root.Values.exporter.canary }}
{{- $args = concat $args (list "--canary" "--canary-check" .root.Values.exporter.canaryCheck) }}
{{- end }}
{{- $args = concat $args (list "--gpu-metrics" (include "ornith.exporterGpuMetrics" .)) }}
{{- if include "ornith.exporterModelCache" . }}
{{- $args = concat $args (list "--model-cache" .root.Values.modelCache.mountPath) }}
{{- end }}
{{- toJson (concat $args .root.Values.exporter.extraArgs) }}
{{- end }}

{{- define "ornith.apiKeyEnv" -}}
{{- with .Values.apiKey.secretName }}
- name: ORNITH_API_KEY
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $.Values.apiKey.secretKey }}
{{- end }}
{{- end }}

{{- /* The operator's credential (apiKey.operatorSecretKey of the same Secret, optional there): the gateway's
     control plane and the engine's admin routes. The exporter never gets it. */}}
{{- define "ornith.operatorKeyEnv" -}}
{{- with .Values.apiKey.secretName }}
- name: ORNITH_OPERATOR_KEY
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $.Values.apiKey.operatorSecretKey }}
      optional: true
{{- end }}
{{- end }}

{{- /* The exporter's GPU metrics (--gpu-metrics): NVML sees GPUs only in a sidecar of a GPU engine pod, where the
     NVIDIA runtime gives it the node's GPUs (NVIDIA_VISIBLE_DEVICES=all, utility libraries only): `auto` is
     `required` there (no NVML pages, OrnithNvmlFailing); `off` everywhere else (a separate exporter pod runs
     apart from the GPUs), and wherever exporter.gpuMetrics says "off" (NVIDIA's dcgm-exporter instead). */}}
{{- define "ornith.exporterGpuMetrics" -}}
{{- $v := .root.Values }}
{{- if and .podName (gt (int $v.engine.gpusPerNode) 0) (ne (toString $v.exporter.gpuMetrics) "off") }}
{{- if eq (toString $v.exporter.gpuMetrics) "auto" }}required{{ else }}{{ $v.exporter.gpuMetrics }}{{ end }}
{{- else }}off{{ end }}
{{- end }}

{{- /* Whether the exporter mounts the model cache read-only (--model-cache): a sidecar shares its pod's volume;
     a separate exporter pod mounts the claim only where it is ReadWriteMany (a ReadWriteOnce claim is the
     engine node's). Non-empty: yes. */}}
{{- define "ornith.exporterModelCache" -}}
{{- $v := .root.Values }}
{{- if or .podName (and $v.modelCache.enabled (has "ReadWriteMany" $v.modelCache.accessModes)) }}yes{{ end }}
{{- end }}

{{- define "ornith.exporterContainer" -}}
- name: exporter
  image: {{ include "ornith.image" (dict "root" .root "image" .root.Values.exporter.image "key" "exporter.image") | quote }}
  imagePullPolicy: {{ .root.Values.exporter.image.pullPolicy }}
  args: {{ include "ornith.exporterArgs" . }}
  {{- $apiKeyEnv := include "ornith.apiKeyEnv" .root | trim }}
  {{- $nvml := ne (include "ornith.exporterGpuMetrics" .) "off" }}
  {{- if or .podName $apiKeyEnv $nvml }}
  env:
  {{- if .podName }}
    - name: ORNITH_POD_NAME
      valueFrom:
        fieldRef:
          fieldPath: metadata.name
  {{- end }}
  {{- with $apiKeyEnv }}
    {{- . | nindent 4 }}
  {{- end }}
  {{- if $nvml }}
    # NVML of the node's GPUs (those the engine container holds among them), no CUDA.
    - name: NVIDIA_VISIBLE_DEVICES
      value: all
    - name: NVIDIA_DRIVER_CAPABILITIES
      value: utility
  {{- end }}
  {{- end }}
  {{- if include "ornith.exporterModelCache" . }}
  volumeMounts:
    - name: model-cache
      mountPath: {{ .root.Values.modelCache.mountPath }}
      readOnly: true
  {{- end }}
  ports:
    - name: metrics
      containerPort: {{ .root.Values.exporter.port }}
      protocol: TCP
  # The probes ask the exporter's own page (/): /metrics would scrape every engine on each probe.
  readinessProbe:
    httpGet:
      path: /
      port: metrics
    periodSeconds: 15
    timeoutSeconds: 5
  livenessProbe:
    httpGet:
      path: /
      port: metrics
    periodSeconds: 30
    timeoutSeconds: 10
  resources: {{- toYaml .root.Values.exporter.resources | nindent 4 }}
  securityContext: {{- toYaml .root.Values.exporter.securityContext | nindent 4 }}
{{- end }}
