package deploy

import (
	"maps"
	"os/exec"
	"slices"
	"testing"
)

// docs/OPERATIONS.md's day-two sequences are run as written: each ```sh block that a cluster test
// runs carries a marker comment on the line before it,
//
//	<!-- ops-test: PHASE NAME -->
//
// and TestE2EClusterDayTwo runs it by PHASE and NAME (opsNames).
const (
	opsMarker     = "<!-- ops-test: "
	operationsDoc = "../docs/OPERATIONS.md"
)

// opsNames are the blocks TestE2EClusterDayTwo runs, by phase, in the document's order.
var opsNames = map[string][]string{
	"pause":     {"all"},
	"resume":    {"all"},
	"nats-lost": {"converge", "release"},
	"rotate": {"payload-key add", "payload-key swap", "payload-key drop",
		"bootstrap-key add", "bootstrap-key swap", "bootstrap-key drop",
		"webhook-secret add", "webhook-secret swap", "webhook-secret drop",
		"runner-credentials register", "runner-credentials pause", "runner-credentials swap", "runner-credentials resume",
		"nats-credentials add", "nats-credentials swap", "nats-credentials drop"},
}

// opsNotOnCluster are the marked blocks TestE2EClusterDayTwo does not run, and why (who does).
var opsNotOnCluster = map[string]string{
	"rotate runner-credentials swap-helm": "the chart's keys Job registering the pools: the DayTwo cluster is the kustomize install; TestOpsRotationBlocks runs it against a fake kubectl",
	"rotate nats-credentials reload":      "restarts the NATS chart's StatefulSet; the test cluster's NATS is a process on the machine, which DayTwo restarts with the same two files",
	"rotate ca swap":                      "the chart's identity ca: TestE2EClusterHelmBuiltinIdentity/RotateCA runs it",
	"rotate ca drop":                      "the chart's identity ca: TestE2EClusterHelmBuiltinIdentity/RotateCA runs it",
}

// TestOperationsBlocks checks docs/OPERATIONS.md's marked blocks as the commands
// TestE2EClusterDayTwo runs: exactly the named ones it knows, each once; each parses (bash -n);
// none holds a <placeholder>, PLACEHOLDER or an example host.
func TestOperationsBlocks(t *testing.T) {
	got := map[string][]string{}
	for _, b := range docBlocks(t, operationsDoc, opsMarker) {
		if b.phase == "" {
			continue // an example, not run by a test
		}
		if _, ok := opsNotOnCluster[b.phase+" "+b.name]; !ok {
			got[b.phase] = append(got[b.phase], b.name)
		}
		if out, err := exec.Command("bash", "-n", "-c", b.text).CombinedOutput(); err != nil {
			t.Errorf("%s:%d %s %s: bash -n: %v\n%s", b.file, b.line, b.phase, b.name, err, out)
		}
		if p := placeholder.FindString(b.text); p != "" {
			t.Errorf("%s:%d %s %s: placeholder %s", b.file, b.line, b.phase, b.name, p)
		}
		if p := exampleValue.FindString(b.text); p != "" {
			t.Errorf("%s:%d %s %s: %s, a value to replace, in a block run as written", b.file, b.line, b.phase, b.name, p)
		}
	}
	for _, phase := range slices.Sorted(maps.Keys(opsNames)) {
		if !slices.Equal(got[phase], opsNames[phase]) {
			t.Errorf("%s's ops-test %s blocks: %q, TestE2EClusterDayTwo runs %q", operationsDoc, phase, got[phase], opsNames[phase])
		}
	}
	for phase := range got {
		if _, ok := opsNames[phase]; !ok {
			t.Errorf("%s: ops-test blocks of phase %q, which no test runs", operationsDoc, phase)
		}
	}
}
