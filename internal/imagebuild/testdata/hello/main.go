// Command hello is the small binary the imagebuild test puts in an image:
// like every function, it answers --version with its name first, and the
// commit the build stamped.
package main

import (
	"fmt"
	"os"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/function"
)

func main() {
	if len(os.Args) == 2 && os.Args[1] == "--version" {
		function.PrintVersion(os.Stdout, "hello")
		return
	}
	fmt.Fprintln(os.Stderr, "usage: hello --version")
	os.Exit(2)
}
