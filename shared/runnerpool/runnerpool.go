// Package runnerpool reads the runner pools an installation serves. A pool is
// one Gitea runner registration: the labels it answers, the backend its jobs
// run on with that backend's profile, and how many of its tasks may be in
// flight at once. One registration holds many tasks, so a pool is not one
// runner process: it is a queue of capacity slots.
package runnerpool

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/imagepolicy"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// DefaultJobTimeout is Gitea's ENDLESS_TASK_TIMEOUT: no task outlives it.
const DefaultJobTimeout = 3 * time.Hour

// Pool is one runner pool.
type Pool struct {
	// Name names the pool in assignment IDs and metadata: a DNS label of at
	// most taskassignment.MaxPoolLength characters.
	Name string `json:"name"`
	// Labels are declared to Gitea; a job whose runs-on labels are all
	// among them may be claimed by the pool.
	Labels  []string                   `json:"labels"`
	Backend taskassignment.BackendKind `json:"backend"`
	// Capacity is the most tasks of the pool claimed and not yet finished.
	Capacity int `json:"capacity"`
	// Credentials is the file holding the pool's registration; empty means
	// <state dir>/<name>.json.
	Credentials string `json:"credentials,omitempty"`
	// JobTimeout bounds a job from claim to end (executor deadline, payload
	// lifetime); empty means DefaultJobTimeout.
	JobTimeout Duration `json:"jobTimeout,omitempty"`
	// Images is which images the pool's jobs may choose (`container:` and
	// `services:`) and how executors pull them; the zero value admits any
	// image and pulls it Always.
	Images imagepolicy.Policy `json:"images,omitempty"`
	// Profile is the backend's own settings for the pool's executors (a Pod
	// template, a sandbox pool, ...), read by that backend.
	Profile json.RawMessage `json:"profile,omitempty"`
	// Paused stops dispatch claiming tasks for the pool: its running jobs
	// finish, its waiting tasks are kept alive, its queued jobs wait in
	// Gitea. Set in the file, or by PoolSettings.Paused.
	Paused bool `json:"paused,omitempty"`
}

// CheckImages checks the images task t chose (its `container:` image and
// each service's) against the pool's Images. A backend calls it before it
// creates anything: the error wraps imagepolicy.ErrRefused and names the
// pool, the image and the rule, for the job's log; no retry changes it.
func (p Pool) CheckImages(t taskassignment.Task) error {
	if t.Image != "" {
		if err := p.Images.CheckContainer(t.Image); err != nil {
			return fmt.Errorf("runner pool %q: %w", p.Name, err)
		}
	}
	for _, s := range t.Services {
		if err := p.Images.CheckService(s.ID, s.Image); err != nil {
			return fmt.Errorf("runner pool %q: %w", p.Name, err)
		}
	}
	return nil
}

// Duration is a time.Duration written as "90m" in the file.
type Duration time.Duration

func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration must be a string such as \"90m\"")
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// Timeout returns the pool's job timeout.
func (p Pool) Timeout() time.Duration {
	if p.JobTimeout <= 0 {
		return DefaultJobTimeout
	}
	return time.Duration(p.JobTimeout)
}

// Matches reports whether a job with runs-on labels may run in the pool:
// every one of them is one of the pool's labels (Gitea's rule).
func (p Pool) Matches(runsOn []string) bool {
	for _, l := range runsOn {
		if !slices.Contains(p.Labels, l) {
			return false
		}
	}
	return len(runsOn) > 0
}

// Pools is the configured set, in file order.
type Pools []Pool

// Get returns the pool called name, or an error naming it.
func (ps Pools) Get(name string) (Pool, error) {
	for _, p := range ps {
		if p.Name == name {
			return p, nil
		}
	}
	return Pool{}, fmt.Errorf("unknown runner pool %q", name)
}

// ReportGrace is how long a task's payload outlives its pool's job timeout:
// time for recover to see the task end, report it and clean up.
const ReportGrace = time.Hour

// PayloadTTL is how long a claimed task's payload is kept: the longest job
// timeout of any pool, and ReportGrace.
func (ps Pools) PayloadTTL() time.Duration {
	var ttl time.Duration
	for _, p := range ps {
		ttl = max(ttl, p.Timeout())
	}
	return ttl + ReportGrace
}

type file struct {
	Pools Pools `json:"pools"`
}

// Load reads the pools from a YAML or JSON file; stateDir completes
// credential paths left empty. Unknown fields, duplicate names and invalid
// pools are errors naming the pool and the field.
func Load(path, stateDir string) (Pools, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("runner pools: %w", err)
	}
	ps, err := Parse(data, stateDir)
	if err != nil {
		return nil, fmt.Errorf("runner pools %s: %w", path, err)
	}
	return ps, nil
}

// Parse is Load without the file.
func Parse(data []byte, stateDir string) (Pools, error) {
	var f file
	if err := yaml.UnmarshalStrict(data, &f); err != nil {
		return nil, err
	}
	if len(f.Pools) == 0 {
		return nil, errors.New("no pools")
	}
	seen := map[string]bool{}
	for i := range f.Pools {
		p := &f.Pools[i]
		if err := p.validate(); err != nil {
			return nil, err
		}
		if seen[p.Name] {
			return nil, fmt.Errorf("pool %q is defined twice", p.Name)
		}
		seen[p.Name] = true
		if p.Credentials == "" {
			if stateDir == "" {
				return nil, fmt.Errorf("pool %q: no credentials file and no state directory", p.Name)
			}
			p.Credentials = filepath.Join(stateDir, p.Name+".json")
		}
	}
	return f.Pools, nil
}

func (p Pool) validate() error {
	if err := taskassignment.ValidatePool(p.Name); err != nil {
		return fmt.Errorf("pool %q: %w", p.Name, err)
	}
	if len(p.Labels) == 0 {
		return fmt.Errorf("pool %q: no labels", p.Name)
	}
	for _, l := range p.Labels {
		if l == "" {
			return fmt.Errorf("pool %q: empty label", p.Name)
		}
	}
	if _, err := taskassignment.ParseBackendKind(string(p.Backend)); err != nil {
		return fmt.Errorf("pool %q: %w", p.Name, err)
	}
	if p.Capacity < 1 {
		return fmt.Errorf("pool %q: capacity %d is below 1", p.Name, p.Capacity)
	}
	if p.JobTimeout < 0 {
		return fmt.Errorf("pool %q: negative job timeout", p.Name)
	}
	if err := p.Images.Validate(); err != nil {
		return fmt.Errorf("pool %q: %w", p.Name, err)
	}
	return nil
}

// PoolSettings is embedded in the configuration of every function that reads the
// pools: where the file is, and where credentials live by default.
type PoolSettings struct {
	PoolsFile string `envconfig:"GDR_POOLS_FILE" required:"true" desc:"YAML file of runner pools (name, labels, backend, capacity, credentials, jobTimeout, images, profile, paused)"`
	// Paused pauses pools without editing the file (see Pool.Paused).
	Paused   string `envconfig:"GDR_PAUSED_POOLS" desc:"pools dispatch claims no task for, besides those the pools file pauses: a comma-separated list of pool names, or * for every pool; their running jobs finish and their queued jobs wait in Gitea (docs/OPERATIONS.md, \"Pausing\")"`
	StateDir string `envconfig:"GDR_STATE_DIR" default:"/var/lib/gitea-dynamic-runner" desc:"where a pool's runner credentials are kept when its credentials path is empty"`
}

// Load reads the pools of s and pauses those s.Paused names, leaving a name
// that is no pool alone: every function reads the setting, and a typo in it
// must not stop handle, recover or the gateway, whose running jobs it would
// break. dispatch, the one that acts on it, refuses such a name
// (CheckPaused).
func (s PoolSettings) Load() (Pools, error) {
	ps, err := Load(s.PoolsFile, s.StateDir)
	if err != nil {
		return nil, err
	}
	_ = ps.Pause(s.Paused)
	return ps, nil
}

// CheckPaused reports what in s.Paused does not name pools of ps, naming
// the variable and the name at fault.
func (s PoolSettings) CheckPaused(ps Pools) error {
	if err := slices.Clone(ps).Pause(s.Paused); err != nil {
		return fmt.Errorf("GDR_PAUSED_POOLS: %w", err)
	}
	return nil
}

// Pause marks paused the pools a GDR_PAUSED_POOLS value names: pool names
// separated by commas (spaces around them ignored), or * alone for every
// pool. An empty value pauses nothing. A name that is no pool, or * beside
// names, is an error; the pools it names are paused nonetheless.
func (ps Pools) Pause(names string) error {
	if strings.TrimSpace(names) == "*" {
		for i := range ps {
			ps[i].Paused = true
		}
		return nil
	}
	var errs []error
	for _, name := range strings.Split(names, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		if name == "*" {
			errs = append(errs, errors.New("* pauses every pool: write it alone, not beside pool names"))
			continue
		}
		i := slices.IndexFunc(ps, func(p Pool) bool { return p.Name == name })
		if i < 0 {
			errs = append(errs, fmt.Errorf("pool %q is not in the pools file", name))
			continue
		}
		ps[i].Paused = true
	}
	return errors.Join(errs...)
}
