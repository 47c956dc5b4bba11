//go:build fetchack_pod

package main

// Built with -tags fetchack_pod, the reference also links what the pod
// backend's builder links (shared/backend/pod), and runs their package
// initialisation, without using them: the floor of a handle that can serve
// the pod backend.
import (
	_ "google.golang.org/grpc"
	_ "k8s.io/client-go/kubernetes"
	_ "k8s.io/client-go/tools/clientcmd"
)
