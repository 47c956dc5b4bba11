// Package deploy holds no code: it exists so that its tests can validate the Kubernetes
// manifests in deploy/base, deploy/keda and deploy/knative (kustomizations: keda and knative
// include base) against the KEDA and Knative CRD schemas in testdata/crds and against the
// k8s.io/api types, build them with kustomize, and, with the e2e tag, apply them to a real API
// server and run the pod backend under the shipped RBAC.
package deploy
