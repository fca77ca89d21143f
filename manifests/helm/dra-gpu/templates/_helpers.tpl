{{/* Names and labels shared by every template. */}}

{{- define "dra-gpu.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "dra-gpu.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "dra-gpu.selectorLabels" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "dra-gpu.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{- define "dra-gpu.pluginName" -}}
{{- printf "%s-kubelet-plugin" (include "dra-gpu.fullname" .) -}}
{{- end -}}

{{- define "dra-gpu.controllerName" -}}
{{- printf "%s-controller" (include "dra-gpu.fullname" .) -}}
{{- end -}}

{{- define "dra-gpu.webhookName" -}}
{{- printf "%s-webhook" (include "dra-gpu.fullname" .) -}}
{{- end -}}

{{- define "dra-gpu.webhookSecret" -}}
{{- .Values.webhook.tls.secretName | default (printf "%s-webhook-tls" (include "dra-gpu.fullname" .)) -}}
{{- end -}}

{{- define "dra-gpu.pluginDataDir" -}}
{{- printf "%s/plugins/%s" (trimSuffix "/" .Values.kubeletPlugin.kubeletDir) .Values.driverName -}}
{{- end -}}

{{- /* Webhook match conditions (CEL). The DeviceClaim of a claim or a template, optional. */ -}}
{{- define "dra-gpu.claimDevices" -}}
(request.resource.resource == 'resourceclaimtemplates' ? object.spec.?spec.?devices : object.spec.?devices)
{{- end -}}

{{- /* Config entry `c` is an opaque config of this driver. */ -}}
{{- define "dra-gpu.isDriverConfig" -}}
c.?opaque.?driver.orValue('') == {{ .Values.driverName | squote }}
{{- end -}}

{{- /* CEL selector `s` mentions this driver (its attributes and capacities are qualified by it). */ -}}
{{- define "dra-gpu.namesDriver" -}}
s.?cel.?expression.orValue('').contains({{ .Values.driverName | squote }})
{{- end -}}

{{- /* Never the system namespaces: nothing there may wait for this driver's webhook. */ -}}
{{- define "dra-gpu.webhookNamespaceSelector" -}}
namespaceSelector:
  matchExpressions:
    - key: kubernetes.io/metadata.name
      operator: NotIn
      values: {{ toJson .Values.webhook.ignoredNamespaces }}
{{- end -}}

{{- /* The label that tells the pods of one kubelet-plugin pool from another's. */ -}}
{{- define "dra-gpu.poolLabel" -}}
dra-gpu/pool
{{- end -}}
