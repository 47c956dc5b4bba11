// Command hello is the small binary the imagebuild test puts in an image:
// like every function, it answers --version with its name first.
package main

import (
	"fmt"
	"os"
	"runtime"
)

func main() {
	if len(os.Args) == 2 && os.Args[1] == "--version" {
		fmt.Println("hello", runtime.Version())
		return
	}
	fmt.Fprintln(os.Stderr, "usage: hello --version")
	os.Exit(2)
}
