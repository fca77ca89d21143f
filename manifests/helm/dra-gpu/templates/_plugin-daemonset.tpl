{{- /*
One kubelet-plugin DaemonSet (kubelet-plugin.yaml renders one, or one per pool). Its context:
root (the chart's top context), plugin (the kubeletPlugin values, with a pool's settings over
them), pool (the pool's name; empty for the single DaemonSet), nodeSelector, image, and where
(the values' path that errors name).
*/ -}}
{{- define "dra-gpu.pluginDaemonSet" -}}
{{- $root := .root -}}
{{- $plugin := .plugin -}}
{{- $pool := .pool -}}
{{- $nodeSelector := .nodeSelector -}}
{{- $image := .image -}}
{{- $where := .where | default "kubeletPlugin" -}}
{{- $poolLabel := include "dra-gpu.poolLabel" $root -}}
{{- $dataDir := include "dra-gpu.pluginDataDir" $root -}}
{{- $registryDir := printf "%s/plugins_registry" (trimSuffix "/" $plugin.kubeletDir) -}}
{{- /*
The driver root is mounted at its host path, so paths the plugin finds under it are the paths
the container runtime must bind (CDI specs name host paths). The host's "/" cannot be mounted
at "/": it goes to /driver-root, and HOST_DRIVER_ROOT tells the plugin what to write instead.
*/ -}}
{{- $hostDriverRoot := $plugin.driverRoot | default "/" -}}
{{- $driverRoot := ternary "/driver-root" $hostDriverRoot (eq $hostDriverRoot "/") -}}
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: {{ include "dra-gpu.pluginName" $root }}{{ with $pool }}-{{ . }}{{ end }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "dra-gpu.labels" $root | nindent 4 }}
    app.kubernetes.io/component: kubelet-plugin
    {{- with $pool }}
    {{ $poolLabel }}: {{ . }}
    {{- end }}
spec:
  selector:
    matchLabels:
      {{- include "dra-gpu.selectorLabels" (dict "root" $root "component" "kubelet-plugin") | nindent 6 }}
      {{- with $pool }}
      {{ $poolLabel }}: {{ . }}
      {{- end }}
  updateStrategy:
    type: RollingUpdate
    rollingUpdate:
      maxSurge: 1
      maxUnavailable: 0
  template:
    metadata:
      labels:
        {{- include "dra-gpu.selectorLabels" (dict "root" $root "component" "kubelet-plugin") | nindent 8 }}
        {{- with $pool }}
        {{ $poolLabel }}: {{ . }}
        {{- end }}
      {{- with $plugin.podAnnotations }}
      annotations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
    spec:
      serviceAccountName: {{ include "dra-gpu.pluginName" $root }}
      {{- if and $root.Values.metrics.enabled $root.Values.metrics.telemetry.hostPID }}
      # GPU processes by pod (docs/user/metrics.md#gpu-telemetry): NVML names them by host PID.
      hostPID: true
      {{- end }}
      {{- with $plugin.priorityClassName }}
      priorityClassName: {{ . }}
      {{- end }}
      {{- with $root.Values.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- if $plugin.affinity }}
      affinity:
        {{- toYaml $plugin.affinity | nindent 8 }}
      {{- else if and (not $root.Values.simulate.enabled) $plugin.gpuNodeLabel.key }}
      affinity:
        nodeAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms:
              - matchExpressions:
                  - key: {{ $plugin.gpuNodeLabel.key }}
                    operator: In
                    values: [{{ $plugin.gpuNodeLabel.value | quote }}]
      {{- end }}
      {{- with $plugin.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      containers:
        - name: plugin
          image: {{ $image }}
          imagePullPolicy: {{ $root.Values.image.pullPolicy }}
          args: ["kubelet-plugin"]
          env:
            - name: NODE_NAME
              valueFrom:
                fieldRef:
                  fieldPath: spec.nodeName
            - name: POD_UID
              valueFrom:
                fieldRef:
                  fieldPath: metadata.uid
            - name: DRIVER_NAME
              value: {{ $root.Values.driverName | quote }}
            - name: PLUGIN_REGISTRY_DIR
              value: {{ $registryDir | quote }}
            - name: PLUGIN_DATA_DIR
              value: {{ $dataDir | quote }}
            - name: CDI_ROOT
              value: {{ $plugin.cdiRoot | quote }}
            - name: STATE_DIR
              value: {{ $plugin.stateDir | default $dataDir | quote }}
            {{- if $root.Values.simulate.enabled }}
            - name: DRA_GPU_SIMULATE
              value: {{ required "simulate.profile is required" $root.Values.simulate.profile | quote }}
            {{- else }}
            - name: DRIVER_ROOT
              value: {{ $driverRoot | quote }}
            - name: HOST_DRIVER_ROOT
              value: {{ $hostDriverRoot | quote }}
            {{- end }}
            - name: HEALTHZ_PORT
              value: {{ $plugin.healthzPort | quote }}
            # Probes come from the kubelet to the pod IP.
            - name: HEALTHZ_ADDRESS
              value: "0.0.0.0"
            - name: LOG_LEVEL
              value: {{ $plugin.logLevel | quote }}
            - name: REDISCOVER_INTERVAL
              value: {{ $plugin.rediscoverInterval | quote }}
            - name: NODE_LABELS
              value: {{ $plugin.nodeLabels.enabled | toString | quote }}
            {{- if $plugin.sharing.timeSlicing }}
            - name: TIME_SLICING_SETTINGS
              value: "true"
            {{- end }}
            {{- if $plugin.sharing.mps }}
            - name: MPS_SUPPORT
              value: "true"
            {{- end }}
            {{- $shares := toString ($plugin.sharing.consumableShares | default "disabled") }}
            {{- if not (eq $shares "disabled") }}
            {{- if not (regexMatch "^(memory|unlimited|[1-9][0-9]*)$" $shares) }}
            {{- fail (printf "%s.sharing.consumableShares must be memory, unlimited, a positive integer or disabled, not %q" $where $shares) }}
            {{- end }}
            - name: CONSUMABLE_SHARES
              value: {{ $shares | quote }}
            {{- end }}
            {{- if not (has $plugin.migMode (list "static" "dynamic")) }}
            {{- fail (printf "%s.migMode must be static or dynamic, not %q" $where $plugin.migMode) }}
            {{- end }}
            {{- /* static is the plugin's default: left out, the default manifests stay as they were */}}
            {{- if eq $plugin.migMode "dynamic" }}
            - name: MIG_MODE
              value: "dynamic"
            {{- end }}
            {{- if $root.Values.metrics.enabled }}
            - name: METRICS_ADDRESS
              value: {{ printf "0.0.0.0:%v" $root.Values.metrics.pluginPort | quote }}
            - name: TELEMETRY_INTERVAL
              value: {{ $root.Values.metrics.telemetry.interval | quote }}
            - name: IDLE_AFTER
              value: {{ $root.Values.metrics.telemetry.idleAfter | quote }}
            {{- end }}
          ports:
            - name: healthz
              containerPort: {{ $plugin.healthzPort }}
              protocol: TCP
            {{- if $root.Values.metrics.enabled }}
            - name: metrics
              containerPort: {{ $root.Values.metrics.pluginPort }}
              protocol: TCP
            {{- end }}
          livenessProbe:
            httpGet:
              path: /healthz
              port: healthz
            initialDelaySeconds: 10
            periodSeconds: 10
            failureThreshold: 3
          # Ready only once the kubelet confirmed the registration: a rolling update stops the
          # old pod when this one is Ready, and the kubelet calls the newest instance it registered.
          readinessProbe:
            httpGet:
              path: /readyz
              port: healthz
            periodSeconds: 1
          {{- with $plugin.resources }}
          resources:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          securityContext:
            {{- if $root.Values.simulate.enabled }}
            # Root only to own its files on the host paths; no capabilities, no device access.
            runAsUser: 0
            runAsNonRoot: false
            allowPrivilegeEscalation: false
            readOnlyRootFilesystem: true
            capabilities:
              drop: ["ALL"]
            {{- else }}
            # NVML opens every /dev/nvidia* node, and MIG, compute-mode and time-slice changes
            # need the device cgroup and CAP_SYS_ADMIN: the plugin must be privileged.
            privileged: true
            runAsUser: 0
            readOnlyRootFilesystem: true
            {{- end }}
            seccompProfile:
              type: RuntimeDefault
          volumeMounts:
            - name: plugins-registry
              mountPath: {{ $registryDir }}
            - name: plugin-data
              mountPath: {{ $dataDir }}
            {{- if and $plugin.stateDir (ne $plugin.stateDir $dataDir) }}
            - name: state
              mountPath: {{ $plugin.stateDir }}
            {{- end }}
            - name: cdi
              mountPath: {{ $plugin.cdiRoot }}
            {{- if not $root.Values.simulate.enabled }}
            - name: driver-root
              mountPath: {{ $driverRoot }}
              readOnly: true
              # The GPU Operator's driver container mounts its root after this pod may start.
              mountPropagation: HostToContainer
            {{- end }}
            - name: tmp
              mountPath: /tmp
      volumes:
        - name: plugins-registry
          hostPath:
            path: {{ $registryDir }}
            type: DirectoryOrCreate
        - name: plugin-data
          hostPath:
            path: {{ $dataDir }}
            type: DirectoryOrCreate
        {{- if and $plugin.stateDir (ne $plugin.stateDir $dataDir) }}
        - name: state
          hostPath:
            path: {{ $plugin.stateDir }}
            type: DirectoryOrCreate
        {{- end }}
        - name: cdi
          hostPath:
            path: {{ $plugin.cdiRoot }}
            type: DirectoryOrCreate
        {{- if not $root.Values.simulate.enabled }}
        - name: driver-root
          hostPath:
            path: {{ $hostDriverRoot }}
            type: Directory
        {{- end }}
        - name: tmp
          emptyDir:
            medium: Memory
            sizeLimit: 16Mi
{{- end -}}
