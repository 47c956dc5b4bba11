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
package layout
