// Package layout holds the tests that keep the module's layout as
// docs/ARCHITECTURE.md describes it. It has no code of its own.
//
//   - The package map (the code block under "## Packages") is true to the
//     module's packages: a package added, moved or removed without its line,
//     or a line naming no layer, fails.
//   - The imports point as the map's layer column says: no core (layer
//     "core") links the queue, the Knative path or Gitea
//     (shared/assignmentqueue, shared/assignmentevents, shared/gitea), and
//     no transport (layer "transport") links a core, indirect imports
//     included. The cores and transports are read from the map, so a package
//     the map puts in a layer is under its rules.
//   - The security claims (docs/SECURITY.md, README.md's table) cite tests
//     that exist.
//   - The harness packages (internal/testenv and below) hold harnesses and
//     their own tests: no test there imports a product package other than
//     the peers' wire contracts (TestHarnessTestsTestTheHarness).
//   - Every end-to-end test is in `make e2e`: a test file of the e2e tier
//     asks for no tag the Makefile's e2e target does not set, and its tests'
//     names match that target's -run pattern (TestE2ETestsRunInMakeE2E).
package layout
