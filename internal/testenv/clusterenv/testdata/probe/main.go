// Command probe prints what a Pod sees of its ServiceAccount: the size of
// the projected token and CA bundle, the namespace file, and the API
// server's address from the environment. It exits 1 without a token.
package main

import (
	"fmt"
	"os"
)

func main() {
	const dir = "/var/run/secrets/kubernetes.io/serviceaccount"
	tok, err := os.ReadFile(dir + "/token")
	ns, _ := os.ReadFile(dir + "/namespace")
	ca, _ := os.ReadFile(dir + "/ca.crt")
	fmt.Printf("token=%d namespace=%s ca=%d host=%s\n", len(tok), ns, len(ca), os.Getenv("KUBERNETES_SERVICE_HOST"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
