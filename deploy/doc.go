// Package deploy holds no code: it exists so that its tests can validate the Kubernetes
// manifests in deploy/keda and deploy/knative against the KEDA and Knative CRD schemas in
// testdata/crds and against the k8s.io/api types.
package deploy
