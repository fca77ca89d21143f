{{- /*
Whether the kubelet plugin posts GpuIdle Events (docs/user/metrics.md#idle-claims): telemetry runs
with the metrics endpoint, and neither its interval nor metrics.telemetry.idleAfter is 0
(`0`, `0s`, `0m`...: the plugin reads them as off). "true" or empty.
*/ -}}
{{- define "dra-gpu.idleEvents" -}}
{{- $telemetry := .Values.metrics.telemetry -}}
{{- $zero := "^\\s*[0.]*\\s*[smh]?\\s*$" -}}
{{- if and .Values.metrics.enabled
      (not (regexMatch $zero (toString $telemetry.interval)))
      (not (regexMatch $zero (toString $telemetry.idleAfter))) -}}
true
{{- end -}}
{{- end -}}

{{- /*
A ValidatingAdmissionPolicy, with its binding, on the Events the kubelet plugin's token creates.
What holds for all of them is here: the token is bound to a node (the API server writes the
pod's node into the token's extra `authentication.kubernetes.io/node-name`), the Event names
that node as its reporter (source.host, and reportingInstance when set: the API server stores
an unset one as "") and relates no second object, so a stolen token of node A cannot speak
for node B. Arguments (a dict):
- root: the chart's context;
- name: the policy's name, after the plugin's;
- about: a CEL condition choosing which of the plugin's Events this policy judges ("": all);
  the policies' conditions together must cover every Event, or some would go unchecked;
- checks: the name of a template holding this policy's own validations.
*/ -}}
{{- define "dra-gpu.pluginEventsPolicy" -}}
{{- $root := .root -}}
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: {{ include "dra-gpu.pluginName" $root }}-{{ .name }}
  labels:
    {{- include "dra-gpu.labels" $root | nindent 4 }}
    app.kubernetes.io/component: kubelet-plugin
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
      - apiGroups: [""]
        apiVersions: ["*"]
        operations: ["CREATE", "UPDATE"]
        resources: ["events"]
  matchConditions:
    - name: from-kubelet-plugin
      expression: >-
        request.userInfo.username ==
        'system:serviceaccount:{{ $root.Release.Namespace }}:{{ include "dra-gpu.pluginName" $root }}'
    {{- with .about }}
    - name: about
      expression: {{ . }}
    {{- end }}
  variables:
    - name: tokenNode
      expression: >-
        request.userInfo.extra[?'authentication.kubernetes.io/node-name'][0].orValue('')
    - name: involvedKind
      expression: object.involvedObject.?kind.orValue('')
    - name: involvedName
      expression: object.involvedObject.?name.orValue('')
  validations:
    - expression: variables.tokenNode != ''
      message: >-
        the kubelet plugin's token carries no node name; it must run in a pod
        (a node-bound service account token) to post Events
      reason: Forbidden
    - expression: >-
        object.?source.?host.orValue('') == variables.tokenNode &&
        object.?reportingInstance.orValue('') in ['', variables.tokenNode] &&
        !has(object.related)
      messageExpression: >-
        'the kubelet plugin on node ' + variables.tokenNode +
        " must name its own node as the Event's source.host (and reportingInstance, if any)," +
        ' and no related object'
      reason: Forbidden
    {{- include .checks $root | nindent 4 }}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: {{ include "dra-gpu.pluginName" $root }}-{{ .name }}
  labels:
    {{- include "dra-gpu.labels" $root | nindent 4 }}
    app.kubernetes.io/component: kubelet-plugin
spec:
  policyName: {{ include "dra-gpu.pluginName" $root }}-{{ .name }}
  validationActions: [Deny]
{{- end -}}

{{- /* Node events: about the token's own Node only, in `default`. */ -}}
{{- define "dra-gpu.ownNodeEventChecks" -}}
- expression: variables.involvedKind == 'Node' && variables.involvedName == variables.tokenNode
  messageExpression: >-
    'the kubelet plugin on node ' + variables.tokenNode +
    ' may only post Events about its own Node, not about ' +
    variables.involvedKind + ' ' + variables.involvedName
  reason: Forbidden
- expression: request.namespace == 'default'
  messageExpression: >-
    "the kubelet plugin posts its Node's Events in namespace default, not in " + request.namespace
  reason: Forbidden
{{- end -}}

{{- /*
Pods and claims: a Warning of a reason the plugin posts about them, in that object's namespace:
PrepareFailed always (prepare/events.py), GpuIdle while idle-claim Events are on.
*/ -}}
{{- define "dra-gpu.claimEventChecks" -}}
{{- $reasons := list "PrepareFailed" -}}
{{- if include "dra-gpu.idleEvents" . }}{{ $reasons = append $reasons "GpuIdle" }}{{ end -}}
{{- $said := join " or " $reasons -}}
- expression: >-
    object.?reason.orValue('') in ['{{ join "', '" $reasons }}'] &&
    object.?type.orValue('') == 'Warning'
  messageExpression: >-
    'the kubelet plugin may only post {{ $said }} Warnings about pods and claims, not ' +
    object.?type.orValue('') + ' ' + object.?reason.orValue('')
  reason: Forbidden
- expression: >-
    variables.involvedKind in ['Pod', 'ResourceClaim'] &&
    object.involvedObject.?namespace.orValue('') == request.namespace
  messageExpression: >-
    "the kubelet plugin may only post {{ $said }} Warnings about pods and claims of the Event's" +
    ' namespace, not about ' + variables.involvedKind + ' ' +
    object.involvedObject.?namespace.orValue('') + '/' + variables.involvedName
  reason: Forbidden
{{- end -}}
