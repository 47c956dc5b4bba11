// Package deploy holds no code: it exists so that its tests can validate the Kubernetes
// manifests in deploy/base, deploy/keda and deploy/knative (kustomizations: keda and knative
// include base) against the KEDA and Knative CRD schemas in testdata/crds and against the
// k8s.io/api types, build them with kustomize, and, with the e2e tag, apply them to a real API
// server, run the pod backend under the shipped RBAC and handle's ScaledJob under KEDA's real
// operator; the cluster tests (TestE2ECluster*) install the product into a real single-node cluster.
package deploy
