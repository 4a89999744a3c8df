{{/*
The engine pod, shared by the Deployment (role "single") and the LeaderWorkerSet (roles "leader" and
"worker"). Called with (dict "root" $ "role" ROLE).
*/}}

{{- /* ORNITH_REPLICA: a pod is one replica on its own GPUs; the doctor checks those, not the node's. */}}
{{- define "ornith.engineEnv" -}}
{{- $v := .root.Values }}
{{- $env := dict "HF_HOME" $v.modelCache.mountPath "HOME" "/home/ornith" "USER" "ornith" "XDG_CACHE_HOME" "/home/ornith/.cache" "ORNITH_PROFILE" $v.profile "ORNITH_REPLICA" "pod" }}
{{- if include "ornith.downloads" .root }}
{{- /* Everything was fetched by the download Job: never reach the Hub from the engine. */}}
{{- $_ := set $env "HF_HUB_OFFLINE" "1" }}
{{- end }}
{{- if gt (int $v.engine.nodes) 1 }}
{{- $_ := set $env "ORNITH_DIST_PORT" (toString $v.engine.multiNode.port) }}
{{- end }}
{{- if $v.compileCache.enabled }}
{{- $env = merge (deepCopy ($v.compileCache.env | default dict)) $env }}
{{- end }}
{{- $env = merge (deepCopy ($v.engine.env | default dict)) $env }}
{{- range $name := keys $env | sortAlpha }}
- name: {{ $name }}
  value: {{ get $env $name | toString | quote }}
{{- end }}
- name: ORNITH_MODEL_REPO
  value: {{ include "ornith.modelRepo" .root | quote }}
{{- if $v.draft.repo }}
- name: ORNITH_DRAFT_REPO
  value: {{ $v.draft.repo | quote }}
{{- end }}
{{- if and $v.hfToken.secretName (not (include "ornith.downloads" .root)) }}
- name: HF_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ $v.hfToken.secretName }}
      key: {{ $v.hfToken.secretKey }}
{{- end }}
{{- /* The key the engine's own way (engine.keyEnv; SGLang: the file of "ornith.apiKeyFile"). */}}
{{- if $v.apiKey.secretName }}
{{- range $v.engine.keyEnv }}
- name: {{ . }}
  valueFrom:
    secretKeyRef:
      name: {{ $v.apiKey.secretName }}
      key: {{ $v.apiKey.secretKey }}
{{- end }}
{{- end }}
{{- if and $v.apiKey.secretName $v.engine.keyArgs }}
- name: PYTHONPATH
  value: {{ include "ornith.guardDir" .root | quote }}
{{- end }}
{{- with $v.engine.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "ornith.engineResources" -}}
{{- $v := .Values.engine }}
{{- $resources := deepCopy ($v.resources | default dict) }}
{{- if gt (int $v.gpusPerNode) 0 }}
{{- /* Extended resources: requests equal limits; the profile's count wins over a hand-set one. */}}
{{- $gpu := dict "nvidia.com/gpu" (int $v.gpusPerNode) }}
{{- $_ := set $resources "limits" (merge (deepCopy $gpu) ($resources.limits | default dict)) }}
{{- $_ := set $resources "requests" (merge (deepCopy $gpu) ($resources.requests | default dict)) }}
{{- end }}
{{- toYaml $resources }}
{{- end }}

{{/* The engine image's Python packages against the profile's pins (engine.pythonPins, from images.yaml):
importlib.metadata reads the installed versions, and a difference stops the pod before the model loads,
naming the pin, the version found and the fix. The engine's own image, so nothing more is pulled. */}}
{{- define "ornith.pythonPinsCheck" -}}
{{- $v := .Values }}
{{- $image := include "ornith.engineImage" . }}
{{- $args := list $image }}
{{- range $name := keys $v.engine.pythonPins | sortAlpha }}
{{- $args = append $args (printf "%s==%s" $name (get $v.engine.pythonPins $name)) }}
{{- end }}
- name: check-python-pins
  image: {{ $image | quote }}
  imagePullPolicy: {{ $v.engine.image.pullPolicy }}
  command:
    - python3
    - -c
    - |
      import sys
      from importlib.metadata import PackageNotFoundError, version

      image, pins = sys.argv[1], sys.argv[2:]
      wrong = 0
      for pin in pins:
          name, _, wanted = pin.partition("==")
          try:
              found = version(name)
          except PackageNotFoundError:
              found = "not installed"
          if found == wanted:
              print(f"{name} {found}: as pinned")
              continue
          wrong += 1
          print(f"error: engine.pythonPins pins {pin} (src/ornith_stack/images.yaml), but the engine image {image} "
                f"has {name} {found}: use an image with {pin} (docker/engine.Dockerfile builds one on the same "
                f"base with the transformers pin), push it and set engine.image.repository and engine.image.tag",
                file=sys.stderr)
      sys.exit(1 if wrong else 0)
  args: {{ toJson $args }}
  # kubectl describe pod shows the error line as the container's termination message.
  terminationMessagePolicy: FallbackToLogsOnError
  resources:
    requests:
      cpu: 10m
      memory: 32Mi
    limits:
      memory: 128Mi
  securityContext: {{- toYaml $v.engine.securityContext | nindent 4 }}
{{- end }}

{{/* The chart runs the upstream engine image, without ornith-stack's entrypoint: an engine that reads its
API key only from a YAML file (engine.keyConfig: SGLang's --config) gets it from this init container, which
writes the file (mode 0600, JSON being YAML) into a memory-backed volume only the engine mounts. The key
stays off every command line; nothing is written when apiKey.secretName is empty. */}}
{{- define "ornith.apiKeyDir" -}}/run/ornith-key{{- end }}
{{- define "ornith.guardDir" -}}/opt/ornith-guard{{- end }}
{{- define "ornith.apiKeyFile" -}}{{ include "ornith.apiKeyDir" . }}/api-key.yaml{{- end }}
{{- define "ornith.writeApiKey" -}}
{{- $v := .Values }}
- name: write-api-key
  image: {{ include "ornith.engineImage" . | quote }}
  imagePullPolicy: {{ $v.engine.image.pullPolicy }}
  command:
    - python3
    - -c
    - |
      import json, os, sys
      path, option, admin = sys.argv[1], sys.argv[2], sys.argv[3]
      options = {option: os.environ["ORNITH_API_KEY"]}
      if admin and os.environ.get("ORNITH_OPERATOR_KEY"):
          options[admin] = os.environ["ORNITH_OPERATOR_KEY"]
      fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
      with os.fdopen(fd, "w") as out:
          json.dump(options, out)
  args: [{{ include "ornith.apiKeyFile" . | quote }}, {{ index $v.engine.keyConfig 1 | quote }}, {{ $v.engine.adminKeyOption | quote }}]
  env:
    {{- include "ornith.apiKeyEnv" . | nindent 4 }}
    {{- include "ornith.operatorKeyEnv" . | nindent 4 }}
  resources:
    requests:
      cpu: 10m
      memory: 16Mi
    limits:
      memory: 64Mi
  securityContext: {{- toYaml $v.engine.securityContext | nindent 4 }}
  volumeMounts:
    - name: api-key
      mountPath: {{ include "ornith.apiKeyDir" . }}
{{- end }}

{{/* The engine's readiness probe and drain (preStop) run files/engine-lifecycle.py (generated from
src/ornith_stack/engine_lifecycle.py) with the image's python3. Called with (dict "root" $ "action" ready|drain
"role" ROLE). The readiness probe turns false within periodSeconds x failureThreshold of the drain's marker. */}}
{{- define "ornith.unreadySeconds" -}}
{{- $r := .Values.engine.probes.readiness }}
{{- mul (int $r.periodSeconds) (int $r.failureThreshold) }}
{{- end }}
{{- define "ornith.engineLifecycle" -}}
{{- $v := .root.Values }}
{{- $args := list "python3" "-c" (.root.Files.Get "files/engine-lifecycle.py") .action "--port" (toString $v.engine.port) "--marker" "/tmp/ornith-draining" }}
{{- if eq .action "ready" }}
{{- $args = concat $args (list "--served" "/tmp/ornith-served" "--health-path" $v.engine.healthPath "--models-path" $v.engine.modelsPath "--chat-path" $v.engine.chatPath) }}
{{- if and $v.apiKey.secretName $v.engine.keyConfig }}
{{- $args = concat $args (list "--key-file" (include "ornith.apiKeyFile" .root)) }}
{{- else if and $v.apiKey.secretName $v.engine.keyEnv }}
{{- $args = concat $args (list "--key-env" (first $v.engine.keyEnv)) }}
{{- end }}
{{- else }}
{{- if eq .role "worker" }}
{{- /* A worker node keeps the collective up until its leader drained. */}}
{{- $args = concat $args (list "--host-env" "LWS_LEADER_ADDRESS") }}
{{- end }}
{{- $args = concat $args (list "--metrics-path" $v.engine.metricsPath "--unready-seconds" (include "ornith.unreadySeconds" .root) "--max-seconds" (toString $v.engine.drain.maxRequestSeconds)) }}
{{- range $v.engine.drain.metrics }}
{{- $args = concat $args (list "--metric" .) }}
{{- end }}
{{- end }}
{{- toJson $args }}
{{- end }}

{{- define "ornith.enginePodSpec" -}}
{{- $root := .root }}
{{- $v := $root.Values }}
{{- $leader := ne .role "worker" }}
{{- $keyFile := and $leader $v.apiKey.secretName $v.engine.keyConfig }}
{{- $guard := and $leader $v.apiKey.secretName $v.engine.keyArgs }}
serviceAccountName: {{ include "ornith.serviceAccountName" $root }}
automountServiceAccountToken: false
{{- /* Drain (readiness false, then the longest request the profile allows), then the engine's shutdown. */}}
terminationGracePeriodSeconds: {{ add (include "ornith.unreadySeconds" $root) $v.engine.drain.maxRequestSeconds $v.engine.drain.shutdownSeconds }}
{{- with $v.imagePullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
securityContext: {{- toYaml $v.engine.podSecurityContext | nindent 2 }}
{{- with $v.engine.runtimeClassName }}
runtimeClassName: {{ . }}
{{- end }}
{{- with $v.engine.nodeSelector }}
nodeSelector: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.engine.tolerations }}
tolerations: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.engine.affinity }}
affinity: {{- toYaml . | nindent 2 }}
{{- end }}
{{- if or $v.engine.pythonPins (include "ornith.downloads" $root) $keyFile }}
initContainers:
{{- with $v.engine.pythonPins }}
  {{- include "ornith.pythonPinsCheck" $root | nindent 2 }}
{{- end }}
{{- if $keyFile }}
  {{- include "ornith.writeApiKey" $root | nindent 2 }}
{{- end }}
{{- end }}
{{- if include "ornith.downloads" $root }}
  - name: wait-for-model
    image: {{ include "ornith.engineImage" $root | quote }}
    imagePullPolicy: {{ $v.engine.image.pullPolicy }}
    command: ["sh", "-c", "until [ -f \"$MARKER\" ]; do echo \"waiting for the download Job to write $MARKER\"; sleep 15; done"]
    env:
      - name: MARKER
        value: {{ include "ornith.downloadMarker" $root | quote }}
    resources:
      requests:
        cpu: 10m
        memory: 16Mi
      limits:
        memory: 64Mi
    securityContext: {{- toYaml $v.engine.securityContext | nindent 6 }}
    volumeMounts:
      - name: model-cache
        mountPath: {{ $v.modelCache.mountPath }}
        readOnly: true
{{- end }}
containers:
  - name: engine
    image: {{ include "ornith.engineImage" $root | quote }}
    imagePullPolicy: {{ $v.engine.image.pullPolicy }}
{{- $multi := gt (int $v.engine.nodes) 1 }}
{{- /* The engine loads the revision the download Job fetched (offline, a commit or tag has no refs/main). */}}
{{- $profileArgs := $v.engine.args }}
{{- if and (ne $v.model.revision "main") (not (has "--revision" $profileArgs)) }}
{{- $profileArgs = concat $profileArgs (list "--revision" $v.model.revision) }}
{{- end }}
{{- $args := concat $profileArgs (ternary $v.engine.multiNode.args list $multi) $v.engine.extraArgs }}
{{- if $keyFile }}
{{- $args = concat $args (list (index $v.engine.keyConfig 0) (include "ornith.apiKeyFile" $root)) }}
{{- end }}
{{- if $guard }}
{{- $args = concat $args $v.engine.keyArgs }}
{{- end }}
{{- if $leader }}
    command: {{ required "engine.command is required (generated values-<profile>.yaml sets it)" $v.engine.command | toJson }}
    args: {{ $args | toJson }}
{{- else }}
    command: {{ $v.engine.multiNode.workerCommand | toJson }}
    args: {{ concat $args $v.engine.multiNode.workerExtraArgs | toJson }}
{{- end }}
    env: {{- include "ornith.engineEnv" . | trim | nindent 6 }}
    ports:
{{- if $leader }}
      - name: http
        containerPort: {{ $v.engine.port }}
        protocol: TCP
{{- end }}
{{- if $multi }}
      - name: dist
        containerPort: {{ $v.engine.multiNode.port }}
        protocol: TCP
{{- end }}
{{- if $leader }}
{{- /* With an API key the engines guard /v1/*; their health routes stay open. */}}
{{- $readyPath := ternary $v.engine.healthPath $v.engine.modelsPath (not (empty $v.apiKey.secretName)) }}
    startupProbe:
      httpGet:
        path: {{ $readyPath }}
        port: http
      {{- toYaml $v.engine.probes.startup | nindent 6 }}
    readinessProbe:
      exec:
        command: {{ include "ornith.engineLifecycle" (dict "root" $root "action" "ready" "role" .role) }}
      {{- toYaml $v.engine.probes.readiness | nindent 6 }}
    livenessProbe:
      httpGet:
        path: {{ $v.engine.healthPath }}
        port: http
      {{- toYaml $v.engine.probes.liveness | nindent 6 }}
      # A hung engine is restarted without the drain's long grace: its requests are lost anyway.
      terminationGracePeriodSeconds: {{ $v.engine.drain.shutdownSeconds }}
{{- end }}
    lifecycle:
      preStop:
        exec:
          command: {{ include "ornith.engineLifecycle" (dict "root" $root "action" "drain" "role" .role) }}
    resources: {{- include "ornith.engineResources" $root | nindent 6 }}
    securityContext: {{- toYaml $v.engine.securityContext | nindent 6 }}
    volumeMounts:
      - name: shm
        mountPath: /dev/shm
      - name: model-cache
        mountPath: {{ $v.modelCache.mountPath }}
      - name: home
        mountPath: /home/ornith
      - name: tmp
        mountPath: /tmp
{{- if $v.compileCache.enabled }}
      - name: compile-cache
        mountPath: {{ $v.compileCache.mountPath }}
        subPath: {{ required "compileCache.key is required (generated values-<profile>.yaml sets it)" $v.compileCache.key }}
{{- end }}
{{- if $keyFile }}
      - name: api-key
        mountPath: {{ include "ornith.apiKeyDir" $root }}
        readOnly: true
{{- end }}
{{- if $guard }}
      {{- /* The guard module (files/engine_guard.py) where PYTHONPATH finds it as ornith_stack.engine_guard. */}}
      - name: engine-guard
        mountPath: {{ include "ornith.guardDir" $root }}/ornith_stack
        readOnly: true
{{- end }}
{{- with $v.engine.extraVolumeMounts }}
{{ toYaml . | indent 6 }}
{{- end }}
{{- if and $leader $v.exporter.enabled (eq (include "ornith.exporterMode" $root) "sidecar") }}
{{ include "ornith.exporterContainer" (dict "root" $root "targets" (list (printf "http://127.0.0.1:%d" (int $v.engine.port))) "podName" true) | indent 2 }}
{{- end }}
volumes:
{{- if $v.compileCache.enabled }}
  - name: compile-cache
{{- if $v.compileCache.existingClaim }}
    persistentVolumeClaim:
      claimName: {{ $v.compileCache.existingClaim }}
{{- else }}
    emptyDir: {}
{{- end }}
{{- end }}
  - name: shm
    emptyDir:
      medium: Memory
      sizeLimit: {{ $v.engine.shm.sizeLimit }}
  - name: model-cache
{{- if $v.modelCache.enabled }}
    persistentVolumeClaim:
      claimName: {{ include "ornith.cacheClaim" $root }}
{{- else }}
    emptyDir: {}
{{- end }}
  - name: home
    emptyDir: {}
  - name: tmp
    emptyDir: {}
{{- if $keyFile }}
  - name: api-key
    emptyDir:
      medium: Memory
      sizeLimit: 1Mi
{{- end }}
{{- if $guard }}
  - name: engine-guard
    configMap:
      name: {{ include "ornith.fullname" $root }}-engine-guard
{{- end }}
{{- with $v.engine.extraVolumes }}
{{ toYaml . | indent 2 }}
{{- end }}
{{- end }}

{{/* How the engine Deployment rolls: one pod at a time, each drained by its preStop before it stops.
On GPUs no surge pod (maxSurge 0): a cluster sized for the profile has no free GPUs for it, and it would
stay Pending; so one copy is down at a time (for a single copy, the change costs downtime). On CPU
(gpusPerNode 0) a surge pod can be scheduled: the new pod is ready before the old one drains.
progressDeadlineSeconds covers a cold start and a drain. */}}
{{- define "ornith.engineRollout" -}}
{{- $v := .Values.engine }}
{{- $startup := mul (int $v.probes.startup.periodSeconds) (int $v.probes.startup.failureThreshold) }}
progressDeadlineSeconds: {{ add $startup (include "ornith.unreadySeconds" .) $v.drain.maxRequestSeconds $v.drain.shutdownSeconds }}
strategy:
  type: RollingUpdate
  rollingUpdate:
{{- if gt (int $v.gpusPerNode) 0 }}
    maxSurge: 0
    maxUnavailable: 1
{{- else }}
    maxSurge: 1
    maxUnavailable: 0
{{- end }}
{{- end }}
