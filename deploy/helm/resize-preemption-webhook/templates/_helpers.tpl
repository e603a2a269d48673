{{/* Object names: the release's, unless overridden. */}}
{{- define "rpw.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "rpw.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "rpw.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "rpw.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Every namespaced object is in the release's namespace (helm install -n). */}}
{{- define "rpw.namespace" -}}
{{- .Release.Namespace -}}
{{- end -}}

{{/* The repository `make image` names a local build: published nowhere. The one place
the chart names it. */}}
{{- define "rpw.localImage" -}}
localhost/resize-preemption-webhook
{{- end -}}

{{/* repository:tag, and @digest when pinned; the tag defaults to the chart's appVersion.
No repository is the local build, which the install refuses unless image.localBuild says
the nodes have it: a node without it would fail to pull, quietly, forever. */}}
{{- define "rpw.image" -}}
{{- $repository := .Values.image.repository -}}
{{- if not $repository -}}
{{- if not .Values.image.localBuild -}}
{{- fail (printf "image.repository is not set and no image is published: push the image `make image` builds and --set image.repository=<your registry>/resize-preemption-webhook, or --set image.localBuild=true where every node has %s (docs/deploy.md \"The image\")" (include "rpw.localImage" .)) -}}
{{- end -}}
{{- $repository = include "rpw.localImage" . -}}
{{- end -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- printf "%s:%s" $repository $tag -}}
{{- with .Values.image.digest }}@{{ . }}{{ end -}}
{{- end -}}

{{/* The service's ServiceAccount: serviceAccount.name, else <fullname>. */}}
{{- define "rpw.serviceAccountName" -}}
{{- default (include "rpw.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "rpw.tlsSecret" -}}
{{- default (printf "%s-tls" (include "rpw.fullname" .)) .Values.certificates.secretName -}}
{{- end -}}

{{/* The labels deploy/base puts on every object, then Helm's. */}}
{{- define "rpw.labels" -}}
app.kubernetes.io/name: {{ include "rpw.name" . }}
app.kubernetes.io/part-of: {{ include "rpw.name" . }}
{{ include "rpw.helmLabels" . }}
{{- end -}}

{{/* Only on objects Helm renders: tests/e2e/test_helm_chart.py strips exactly these. */}}
{{- define "rpw.helmLabels" -}}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "rpw.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rpw.name" . }}
app.kubernetes.io/component: admission-webhook
{{- end -}}

{{/* The webhook rules shared by both configurations. */}}
{{- define "rpw.webhookCommon" -}}
rules:
  - apiGroups: [""]
    apiVersions: ["v1"]
    operations: ["UPDATE"]
    resources: ["pods/resize"]
    scope: Namespaced
matchPolicy: Equivalent
namespaceSelector:
{{ include "rpw.namespaceSelector" . | indent 2 }}
{{- end -}}

{{/* The webhook configurations' namespaceSelector: webhook.namespaceSelector, else every
namespace but the webhook's own and kube-system. */}}
{{- define "rpw.namespaceSelector" -}}
{{- if .Values.webhook.namespaceSelector -}}
{{ toYaml .Values.webhook.namespaceSelector }}
{{- else -}}
matchExpressions:
  - key: kubernetes.io/metadata.name
    operator: NotIn
    values: [{{ include "rpw.namespace" . | quote }}, "kube-system"]
{{- end -}}
{{- end -}}

{{/* The service's preemptor-namespace-selector, as JSON: settings.preemptorNamespaceSelector,
else the webhook configurations' selection. */}}
{{- define "rpw.preemptorSelector" -}}
{{- if .Values.settings.preemptorNamespaceSelector -}}
{{ toJson .Values.settings.preemptorNamespaceSelector }}
{{- else -}}
{{ include "rpw.namespaceSelector" . | fromYaml | toJson }}
{{- end -}}
{{- end -}}

{{/* clientConfig of a webhook; $path is the endpoint. */}}
{{- define "rpw.clientConfig" -}}
{{- $root := index . 0 -}}
{{- $path := index . 1 -}}
clientConfig:
  {{- with (include "rpw.caBundle" $root) }}
  caBundle: {{ . }}
  {{- end }}
  service:
    name: {{ include "rpw.fullname" $root }}
    namespace: {{ include "rpw.namespace" $root }}
    path: {{ $path }}
    port: {{ $root.Values.service.port }}
{{- end -}}

{{- define "rpw.webhookAnnotations" -}}
{{- if eq .Values.certificates.mode "cert-manager" }}
annotations:
  cert-manager.io/inject-ca-from: {{ include "rpw.namespace" . }}/{{ include "rpw.fullname" . }}
{{- end }}
{{- end -}}

{{/*
The self-signed CA and serving certificate, made once per render and cached on the root
context so the Secret and the webhook configurations agree. On upgrade the Secret's
current files are kept (lookup), so the caBundle and the certificate never change apart.
*/}}
{{- define "rpw.selfSigned" -}}
{{- if not .Values._selfSigned -}}
{{- $secret := lookup "v1" "Secret" (include "rpw.namespace" .) (include "rpw.tlsSecret" .) -}}
{{- if and $secret (index ($secret.data | default dict) "ca.crt") -}}
{{- $_ := set .Values "_selfSigned" (dict "ca" (index $secret.data "ca.crt") "crt" (index $secret.data "tls.crt") "key" (index $secret.data "tls.key")) -}}
{{- else -}}
{{- $svc := include "rpw.fullname" . -}}
{{- $ns := include "rpw.namespace" . -}}
{{- $dns := list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.%s" $svc $ns .Values.certificates.clusterDomain) -}}
{{- $dns = concat $dns .Values.certificates.extraDNSNames -}}
{{- $days := int .Values.certificates.selfSignedDays -}}
{{- $ca := genCA (printf "%s-ca" $svc) $days -}}
{{- $cert := genSignedCert (printf "%s.%s.svc" $svc $ns) .Values.certificates.ipAddresses $dns $days $ca -}}
{{- $_ := set .Values "_selfSigned" (dict "ca" ($ca.Cert | b64enc) "crt" ($cert.Cert | b64enc) "key" ($cert.Key | b64enc)) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "rpw.caBundle" -}}
{{- if eq .Values.certificates.mode "self-signed" -}}
{{- include "rpw.selfSigned" . -}}
{{- .Values._selfSigned.ca -}}
{{- else if eq .Values.certificates.mode "provided" -}}
{{- .Values.certificates.caBundle -}}
{{- end -}}
{{- end -}}

{{- /*
"true" when the service itself keeps kube-apiserver's client certificate: mode service,
clientAuth on, and no CA of the operator's (clientAuth.caBundle).
*/}}
{{- define "rpw.keepsClientCert" -}}
{{- if and .Values.clientAuth.enabled (not .Values.clientAuth.caBundle) (eq .Values.certificates.mode "service") -}}
true
{{- end -}}
{{- end -}}
