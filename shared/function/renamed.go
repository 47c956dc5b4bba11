package function

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/envdoc"
)

// Renamed is one variable that is no longer read under its old name.
type Renamed struct {
	Old, New string
	// What says what the new name is for, when the old name could mislead.
	What string
}

// renamedVars returns the one table of renamed variables (docs/OPERATIONS.md,
// "Renamed settings", lists it for upgrades). A function refuses to start
// while one of the old names is set and is not a variable it reads today
// (GDR_CAPACITY is local mode's pool capacity now, and handle's old name for
// GDR_MAX_IN_FLIGHT): a setting silently ignored after an upgrade would
// leave a deployment running on a default nobody chose.
func renamedVars() []Renamed {
	return []Renamed{
		{Old: "GDR_CAPACITY", New: "GDR_MAX_IN_FLIGHT", What: "handle's limit of assignments delivered and not yet acknowledged; GDR_CAPACITY is only local mode's pool capacity"},
		{Old: "GDR_INTERVAL", New: "GDR_POLL_INTERVAL"},
		{Old: "GDR_BUSY_INTERVAL", New: "GDR_BUSY_POLL_INTERVAL"},
		{Old: "GDR_LOCAL_GITEA_URL", New: "GDR_GITEA_URL"},
		{Old: "GDR_LOCAL_REGISTRATION_TOKEN", New: "GDR_REGISTRATION_TOKEN"},
		{Old: "GDR_LOCAL_LABELS", New: "GDR_LABELS"},
		{Old: "GDR_LOCAL_STATE_DIR", New: "GDR_STATE_DIR"},
		{Old: "GDR_LOCAL_CAPACITY", New: "GDR_CAPACITY"},
		{Old: "GDR_LOCAL_GATEWAY_ADDR", New: "GDR_GATEWAY_ADDR"},
		{Old: "GDR_LOCAL_WEBHOOK_ADDR", New: "GDR_WEBHOOK_ADDR"},
		{Old: "GDR_LOCAL_POLL_INTERVAL", New: "GDR_POLL_INTERVAL"},
		{Old: "GDR_LOCAL_BUSY_POLL_INTERVAL", New: "GDR_BUSY_POLL_INTERVAL"},
		{Old: "GDR_LOCAL_BUSY_WINDOW", New: "GDR_BUSY_WINDOW"},
		{Old: "GDR_LOCAL_METRICS_ADDR", New: "GDR_METRICS_ADDR"},
		{Old: "GDR_LOCAL_RECOVER_INTERVAL", New: "GDR_RECOVER_INTERVAL"},
		{Old: "GDR_LOCAL_LOG_FORMAT", New: "GDR_LOG_FORMAT"},
	}
}

// refuseRenamed returns an error naming every old name of renamedVars that
// is set in the environment and is not a variable of cfg, with its new name.
// cfg's variables are listed only when an old name is set.
func refuseRenamed(cfg any) error {
	var set []Renamed
	for _, r := range renamedVars() {
		if _, ok := os.LookupEnv(r.Old); ok {
			set = append(set, r)
		}
	}
	if len(set) == 0 {
		return nil
	}
	vars, err := envdoc.Vars(cfg)
	if err != nil {
		return err
	}
	var msgs []string
	for _, r := range set {
		if slices.ContainsFunc(vars, func(v envdoc.Var) bool { return v.Name == r.Old }) {
			continue
		}
		m := r.Old + " is no longer read: it was renamed " + r.New
		if r.What != "" {
			m += " (" + r.What + ")"
		}
		msgs = append(msgs, m)
	}
	if len(msgs) == 0 {
		return nil
	}
	return fmt.Errorf("renamed variables (docs/OPERATIONS.md, Renamed settings): %s", strings.Join(msgs, "; "))
}
