// Package layout holds the test that keeps docs/ARCHITECTURE.md's package map
// (the code block under "## Packages") true to the module's packages: a
// package added, moved or removed without its line fails it; and the test
// that keeps the security claims (docs/SECURITY.md, README.md's table) citing
// tests that exist. It has no code of its own.
package layout
