// Command echo is a tiny TCP service for cluster tests (a workflow's
// `services:` sidecar): it listens on :7000 (or the first argument) and
// answers each line it reads with "echo: <line>".
package main

import (
	"bufio"
	"fmt"
	"log"
	"net"
	"os"
)

func main() {
	addr := ":7000"
	if len(os.Args) > 1 {
		addr = os.Args[1]
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("echo: listening on %s", l.Addr())
	for {
		conn, err := l.Accept()
		if err != nil {
			log.Fatal(err)
		}
		go func() {
			defer conn.Close()
			sc := bufio.NewScanner(conn)
			for sc.Scan() {
				fmt.Fprintf(conn, "echo: %s\n", sc.Text())
			}
		}()
	}
}
