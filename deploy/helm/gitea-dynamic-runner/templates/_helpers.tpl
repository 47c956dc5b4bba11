{{/*
gdr.labels: Helm's labels, added to every object's own metadata (never to a selector or a Pod
template, which stay as the kustomize install has them).
*/}}
{{- define "gdr.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
gdr.image: the image of a function: (list $ "handle") -> <images.registry>/gitea-dynamic-runner-handle:<images.tag>,
then @<digest> where images.digests pins it (a release's chart pins every function's).
*/}}
{{- define "gdr.image" -}}
{{- $root := index . 0 -}}
{{- $name := index . 1 -}}
{{- printf "%s/gitea-dynamic-runner-%s:%s" $root.Values.images.registry $name ($root.Values.images.tag | default $root.Chart.AppVersion) -}}
{{- with index ($root.Values.images.digests | default dict) $name }}@{{ . }}{{ end -}}
{{- end }}

{{/*
gdr.workloadAPIVolume: the source of the volume spiffe-workload-api (the SPIRE agent's
Workload API): the SPIFFE CSI driver, or the agent's socket folder on the node.
*/}}
{{- define "gdr.workloadAPIVolume" -}}
{{- with .Values.spire.workloadAPI -}}
{{- if and .hostPath .csiDriver -}}
{{- fail "spire.workloadAPI: set csiDriver or hostPath, not both" -}}
{{- else if .hostPath -}}
hostPath:
  path: {{ .hostPath }}
  type: Directory
{{- else if .csiDriver -}}
csi:
  driver: {{ .csiDriver }}
  readOnly: true
{{- else -}}
{{- fail "spire.workloadAPI: set csiDriver or hostPath" -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/*
gdr.executorsNamespace: the executors' namespace (GDR_KUBE_NAMESPACE): their Pods, Secrets,
Events, handle's and recover's Roles and the executors' network policies. Never the release's:
the control plane's Secrets stay out of those Roles' reach.
*/}}
{{- define "gdr.executorsNamespace" -}}
{{- $ns := required "executors.namespace: the executors' namespace" .Values.executors.namespace -}}
{{- if eq $ns .Release.Namespace -}}
{{- fail (printf "executors.namespace: %q is the release's namespace; executors need one of their own (their Roles read and write its Secrets)" $ns) -}}
{{- end -}}
{{- $ns -}}
{{- end }}

{{/*
gdr.poolLabels: every label of the pools, each once, in the order the pools name them, as a JSON
array: dispatch's ScaledObject has one trigger per label (Gitea's queued jobs that name it).
*/}}
{{- define "gdr.poolLabels" -}}
{{- $labels := list -}}
{{- range .Values.pools -}}
{{- range .labels -}}
{{- $labels = append $labels . -}}
{{- end -}}
{{- end -}}
{{- $labels | uniq | toJson -}}
{{- end }}

{{/*
gdr.podPlacement: a function's Pod placement, (list $ "gateway"): its priorityClassName,
nodeSelector, tolerations and affinity (values <function>.*), and the release's
imagePullSecrets; nothing where none is set.
*/}}
{{- define "gdr.podPlacement" -}}
{{- $root := index . 0 -}}
{{- $c := index $root.Values (index . 1) -}}
{{- with $c.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with $c.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $c.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $c.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
gdr.keysPod: the Pod template of the keys Job and CronJob (`handle keys`): its own
ServiceAccount, hardened, placed and annotated as handle, with resources of its own.
*/}}
{{- define "gdr.keysPod" -}}
metadata:
  labels:
    app.kubernetes.io/part-of: gitea-dynamic-runner
    app.kubernetes.io/name: keys
  {{- with .Values.handle.podAnnotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  restartPolicy: OnFailure
  serviceAccountName: gitea-dynamic-runner-keys
  {{- include "gdr.podPlacement" (list . "handle") | nindent 2 }}
  automountServiceAccountToken: true   # it makes Secrets through the Kubernetes API
  securityContext:
    runAsNonRoot: true
    runAsUser: 65532
    runAsGroup: 65532
    seccompProfile:
      type: RuntimeDefault
  containers:
    - name: keys
      image: {{ include "gdr.image" (list . "handle") }}
      {{- with .Values.images.pullPolicy }}
      imagePullPolicy: {{ . }}
      {{- end }}
      command: ["handle"]
      args: ["keys"]
      envFrom:
        - configMapRef:
            name: gdr-config   # the trust domain, the gateway's ID, Gitea, the pools file
      env:
        - name: GDR_KEYS_NAMESPACE
          valueFrom:
            fieldRef:
              fieldPath: metadata.namespace
        - name: GDR_KEYS_OWNER   # what it makes goes with the release
          value: gdr-config
        - name: GDR_KEYS_CA
          value: {{ eq .Values.identity "ca" | quote }}
        {{- with .Values.gitea.registrationTokenSecret }}
        - name: GDR_KEYS_REGISTER   # every pool registered with Gitea (gdr-runner-credentials)
          value: "true"
        - name: GDR_REGISTRATION_TOKEN
          valueFrom:
            secretKeyRef:
              name: {{ . }}
              key: token
        {{- end }}
      securityContext:
        allowPrivilegeEscalation: false
        readOnlyRootFilesystem: true
        capabilities:
          drop: ["ALL"]
      volumeMounts:
        - name: pools
          mountPath: /etc/gitea-dynamic-runner
          readOnly: true
        - name: tmp
          mountPath: /tmp
      resources:
        requests:
          cpu: 10m
          memory: 64Mi
        limits:
          memory: 128Mi
  volumes:
    - name: pools
      configMap:
        name: gdr-pools
    - name: tmp
      emptyDir:
        sizeLimit: 16Mi
{{- end }}
