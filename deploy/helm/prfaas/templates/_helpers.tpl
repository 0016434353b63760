{{- define "prfaas.fullname" -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "prfaas.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: prfaas
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "prfaas.tlsSecret" -}}
{{- if and .Values.tls.enabled (not .Values.tls.existingSecret) (not .Values.tls.files) -}}
{{- fail "tls.enabled needs tls.existingSecret or tls.files (make them with `prfaas certs`)" -}}
{{- end -}}
{{- .Values.tls.existingSecret | default (printf "%s-certs" (include "prfaas.fullname" .)) -}}
{{- end -}}

{{/* The StatefulSet (and its headless Service) of one role in one datacenter */}}
{{- define "prfaas.group" -}}
{{- printf "%s-%s-%s" (include "prfaas.fullname" .root) .dc.name .role -}}
{{- end -}}

{{/* The nodeSelector of datacenter .name */}}
{{- define "prfaas.nodeSelector" -}}
{{- range .root.Values.datacenters }}{{ if eq .name $.name }}{{ toYaml .nodeSelector }}{{ end }}{{ end -}}
{{- end -}}

{{/* The whole prfaas topology: values.topology + router + one worker per pod */}}
{{- define "prfaas.topology" -}}
{{- $workers := list -}}
{{- range $dc := .Values.datacenters -}}
{{- range $role, $r := $dc.roles -}}
{{- $group := include "prfaas.group" (dict "root" $ "dc" $dc "role" $role) -}}
{{- range $i := until (int $r.replicas) -}}
{{- $name := printf "%s-%d" $group $i -}}
{{- $w := dict "name" $name "role" $role "host" (printf "%s.%s" $name $group) "port" (int $r.port) -}}
{{- if eq $role "pd-d" -}}
{{- $_ := set $w "kv_port" (int $r.kvPort) -}}
{{- $_ := set $w "max_batch" (int ($r.maxBatch | default 16)) -}}
{{- end -}}
{{- $workers = append $workers $w -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $topo := deepCopy .Values.topology -}}
{{- range $key := list "link" "intra_link" -}}
{{- $link := get $topo $key | default dict -}}
{{- if not (hasKey $link "rate_gbps") -}}{{- $_ := set $link "rate_gbps" nil -}}{{- end -}}
{{- $_ := set $topo $key $link -}}
{{- end -}}
{{- $_ := set $topo "router" (dict "host" "0.0.0.0" "port" (int .Values.router.port)) -}}
{{- $_ := set $topo "security" (dict "tls" (ternary (dict "dir" "/etc/prfaas/tls") false .Values.tls.enabled)) -}}
{{- $_ := set $topo "workers" $workers -}}
{{- toYaml $topo -}}
{{- end -}}

{{/* The container of one component: `python -m prfaas.serve.deploy.proc --name NAME` */}}
{{- define "prfaas.container" -}}
- name: {{ .container }}
  image: "{{ .root.Values.image.repository }}:{{ .root.Values.image.tag }}"
  imagePullPolicy: {{ .root.Values.image.pullPolicy }}
  command: [{{ .root.Values.python | quote }}, "-m", "prfaas.serve.deploy.proc",
            "--topology", "/etc/prfaas/topology.yaml", "--name", {{ .name | quote }}]
  env:
    - name: POD_NAME
      valueFrom: {fieldRef: {fieldPath: metadata.name}}
    - name: PRFAAS_NODE_ID   # /health reports where the pod runs (serve/placement.py)
      valueFrom: {fieldRef: {fieldPath: spec.nodeName}}
    - name: PYTHONUNBUFFERED
      value: "1"
    {{- if and .router .root.Values.apiKey.existingSecret }}
    - name: PRFAAS_API_KEY
      valueFrom: {secretKeyRef: {name: {{ .root.Values.apiKey.existingSecret }}, key: api-key}}
    {{- end }}
  ports:
    - {name: http, containerPort: {{ .port }}, protocol: TCP}
    {{- if .kvPort }}
    - {name: kv, containerPort: {{ .kvPort }}, protocol: TCP}
    {{- end }}
  {{- $probe := ternary (dict "tcpSocket" (dict "port" "http")) (dict "httpGet" (dict "path" "/health" "port" "http")) .tcpProbe }}
  readinessProbe:
    {{- toYaml $probe | nindent 4 }}
    periodSeconds: 2
  livenessProbe:
    {{- toYaml $probe | nindent 4 }}
    periodSeconds: 10
    failureThreshold: 6
  resources:
    {{- toYaml .resources | nindent 4 }}
  volumeMounts:
    - {name: topology, mountPath: /etc/prfaas/topology.yaml, subPath: topology.yaml, readOnly: true}
    {{- if .root.Values.tls.enabled }}
    - {name: certs, mountPath: /etc/prfaas/tls, readOnly: true}
    {{- end }}
{{- end -}}

{{- define "prfaas.volumes" -}}
- name: topology
  configMap: {name: {{ include "prfaas.fullname" . }}-topology}
{{- if .Values.tls.enabled }}
- name: certs
  secret: {secretName: {{ include "prfaas.tlsSecret" . }}, defaultMode: 0400}
{{- end }}
{{- end -}}
