// Package spec holds the OpenSandbox lifecycle API specification the project
// generates its client from, unchanged (see README.md for its source).
package spec

import (
	_ "embed"
	"slices"
)

//go:embed sandbox-lifecycle.yml
var lifecycle []byte

// LifecycleYAML returns a copy of sandbox-lifecycle.yml, the OpenAPI 3.1
// document the generated client was made from.
func LifecycleYAML() []byte { return slices.Clone(lifecycle) }
