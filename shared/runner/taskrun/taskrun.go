// Package taskrun executes one Gitea task with Gitea's act fork in host mode:
// the executor (Pod, sandbox, process) is the isolation boundary; run steps
// run in it, and a Docker daemon, where the executor has one (a pod pool's
// docker capability, local mode's machine), runs the steps that are images
// (`docker://`, Docker actions) through stepdocker. It turns the task into an act plan, configures act the way
// Gitea expects (URLs from the task's server_url, never the gateway), and
// runs it with a reporter as act's log hook.
package taskrun

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	runnerv1 "gitea.dev/actions-proto-go/runner/v1"
	"github.com/nektos/act/pkg/common"
	"github.com/nektos/act/pkg/model"
	"github.com/nektos/act/pkg/runner"
	"github.com/sirupsen/logrus"
	"go.yaml.in/yaml/v4"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/jobservices"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/runner/stepdocker"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskworkflow"
)

// Version is what the runner tells steps it is (GITEA_ACTIONS_RUNNER_VERSION).
const Version = "gitea-dynamic-runner"

// endlessMargin keeps a job's deadline inside Gitea's ENDLESS_TASK_TIMEOUT
// (3 h from the claim), so the runner reports before Gitea reaps the task.
const endlessMargin = 5 * time.Minute

// Reporter is what a run needs of reporter.Reporter.
type Reporter interface {
	logrus.Hook
	// JobContext is cancelled when Gitea cancels the task.
	JobContext() context.Context
	Logf(format string, a ...any)
	SetOutputs(outputs map[string]string)
}

// Job is one task, prepared for act.
type Job struct {
	Task *runnerv1.Task
	// ID is the job's key in the workflow.
	ID string

	workflow *model.Workflow
	job      *model.Job
	plan     *model.Plan
	env      map[string]string
	// services run beside the runner; Run waits for their ports.
	services       []jobservices.Service
	serviceTimeout time.Duration
	// docker is the daemon of steps that are images (Host.Docker).
	docker string
}

// Steps is the number of steps, the reporter's step count.
func (j *Job) Steps() int { return len(j.job.Steps) }

// UnsupportedError says, in words for the job log, why a job cannot run in
// this executor.
type UnsupportedError struct{ Reason string }

func (e *UnsupportedError) Error() string { return e.Reason }

// Host describes the executor a job runs in, as its backend told the runner.
type Host struct {
	// Image is the image the executor itself runs (empty when unknown).
	Image string
	// Services are the keys of the job's `services:` the backend runs beside
	// the runner, in its network namespace (the Pod backend's sidecars);
	// none where the backend runs no services.
	Services []string
	// ServiceTimeout bounds the wait for the services' ports (zero:
	// jobservices.DefaultReadyTimeout).
	ServiceTimeout time.Duration
	// Docker is the address of the Docker daemon that answered the runner
	// (stepdocker.Find), which runs the job's `docker://` steps and Docker
	// actions; empty: none, and NoDocker says why.
	Docker, NoDocker string
}

// Prepare reads the task's single-job workflow and plans it. A job whose
// `container:` names host.Image runs on the host, as the backend already
// placed it there; a job whose `services:` are exactly host.Services runs
// once their ports accept connections (see Run), with
// `job.services.<id>.ports[<port>]` reading <port>. Any other `container:`,
// `services:` and container options are refused with an *UnsupportedError.
func Prepare(task *runnerv1.Task, host Host) (*Job, error) {
	payload := task.GetWorkflowPayload()
	wf, err := model.ReadWorkflow(bytes.NewReader(payload))
	if err != nil {
		return nil, fmt.Errorf("read the workflow of task %d: %w", task.GetId(), err)
	}
	ids := wf.GetJobIDs()
	if len(ids) != 1 {
		return nil, fmt.Errorf("the workflow of task %d has %d jobs, want exactly 1", task.GetId(), len(ids))
	}
	id := ids[0]
	services, err := host.services(wf.GetJob(id))
	if err != nil {
		return nil, err
	}
	if len(services) > 0 {
		if expanded := jobservices.ExpandPortExpressions(payload, services); !bytes.Equal(expanded, payload) {
			if wf, err = model.ReadWorkflow(bytes.NewReader(expanded)); err != nil {
				return nil, fmt.Errorf("read the workflow of task %d: %w", task.GetId(), err)
			}
		}
		// The backend runs them: act, which would start them with Docker,
		// must not see them.
		wf.GetJob(id).Services = nil
	}
	// Needs become stub jobs without steps: they feed needs.*, success()
	// and failure() without running.
	var needs []string
	for name, need := range task.GetNeeds() {
		needs = append(needs, name)
		stub := &model.Job{
			Outputs: need.GetOutputs(),
			Result:  strings.ToLower(strings.TrimPrefix(need.GetResult().String(), "RESULT_")),
		}
		stub.RawRunsOn.Kind, stub.RawRunsOn.Tag, stub.RawRunsOn.Value = yaml.ScalarNode, "!!str", "stub"
		wf.Jobs[name] = stub
	}
	slices.Sort(needs)
	job := wf.GetJob(id)
	job.RawNeeds = yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
	for _, n := range needs {
		job.RawNeeds.Content = append(job.RawNeeds.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: n})
	}
	env := map[string]string{}
	if c := job.Container(); c != nil && c.Image != "" {
		switch {
		case host.Image == "":
			return nil, &UnsupportedError{Reason: fmt.Sprintf("this job asks for `container: %s`, but its executor is a process on this machine (local mode, or a process pool): no container, and no Docker daemon to start one; run it on a pod pool (the cluster path runs the job in %s), or remove `container:`", c.Image, c.Image)}
		case c.Image != host.Image:
			return nil, &UnsupportedError{Reason: fmt.Sprintf("this job asks for `container: %s`, but this executor runs %s and has no Docker daemon; use a pool whose backend runs job containers (pod)", c.Image, host.Image)}
		case len(c.Ports) > 0 || len(c.Volumes) > 0 || c.Options != "":
			return nil, &UnsupportedError{Reason: "`container:` ports, volumes and options are not supported: the job already runs in its image"}
		}
		for k, v := range c.Env {
			env[k] = v
		}
		job.RawContainer = yaml.Node{}
	}
	if host.Docker == "" {
		if err := dockerSteps(job, host.NoDocker); err != nil {
			return nil, err
		}
	}
	plan, err := model.CombineWorkflowPlanner(wf).PlanJob(id)
	if err != nil {
		return nil, fmt.Errorf("plan job %s of task %d: %w", id, task.GetId(), err)
	}
	return &Job{Task: task, ID: id, workflow: wf, job: job, plan: plan, env: env,
		services: services, serviceTimeout: host.ServiceTimeout, docker: host.Docker}, nil
}

// noDaemon is what to do instead of a step that runs an image (a `docker://`
// step, a Docker action) where the executor has no Docker daemon.
const noDaemon = "`docker://` steps and Docker actions run in a job of a pod pool whose profile enables the docker capability (`docker:`), or in local mode on a machine with a Docker daemon (DOCKER_HOST, else /var/run/docker.sock); or run the job in that image (`container:` on a pod pool), or use a JavaScript or composite action; to build an image without a daemon, run `buildctl` (BUILDKIT_HOST) in a job of a pod pool whose profile enables the build capability (`build:`)"

// dockerSteps refuses a step that runs an image (`uses: docker://...`)
// where the executor has no Docker daemon (why: what the runner found).
func dockerSteps(job *model.Job, why string) error {
	for i, st := range job.Steps {
		if st == nil || !strings.HasPrefix(st.Uses, "docker://") {
			continue
		}
		name := cmp.Or(st.Name, st.ID, fmt.Sprintf("#%d", i+1))
		return &UnsupportedError{Reason: fmt.Sprintf("step %s uses `%s`, an image to run with Docker, and this executor has no Docker daemon (%s): %s", name, st.Uses, cmp.Or(why, "none was found"), noDaemon)}
	}
	return nil
}

// services returns the job's services when the host runs exactly those,
// and refuses them otherwise.
func (h Host) services(job *model.Job) ([]jobservices.Service, error) {
	if len(job.Services) == 0 {
		return nil, nil
	}
	if len(h.Services) == 0 {
		return nil, &UnsupportedError{Reason: "this job uses `services:`, which this executor does not run (no Docker daemon; only the pod backend runs services, as sidecars); use a pod pool, or run the services elsewhere"}
	}
	services, err := taskworkflow.FromJob(job)
	if err != nil {
		return nil, &UnsupportedError{Reason: "`services:`: " + err.Error()}
	}
	if got := jobservices.IDs(services); !slices.Equal(got, h.Services) {
		return nil, &UnsupportedError{Reason: fmt.Sprintf("this job's services are %v, but its executor runs %v", got, h.Services)}
	}
	for _, s := range services {
		if _, err := jobservices.ParsePorts(s.Ports); err != nil {
			return nil, &UnsupportedError{Reason: fmt.Sprintf("service %s: %v", s.ID, err)}
		}
	}
	return services, nil
}

// Options place a run.
type Options struct {
	// WorkDir is a per-task directory act works in; CacheDir keeps actions.
	WorkDir, CacheDir string
	// Deadline is the executor's own end (zero: none). The job also stops
	// before Gitea's ENDLESS_TASK_TIMEOUT and at its timeout-minutes.
	Deadline time.Time
	// Claimed is when Gitea handed the task out (zero: now).
	Claimed time.Time
	// CacheURL is the job's ACTIONS_CACHE_URL (the runner's cache proxy);
	// empty: none.
	CacheURL string
}

func (j *Job) str(key string) string {
	return j.Task.GetContext().GetFields()[key].GetStringValue()
}

// config builds act's configuration (RUNNER-PROTOCOL §2.2-2.3).
func (j *Job) config(opt Options) (*runner.Config, error) {
	fields := j.Task.GetContext().GetFields()
	event := map[string]any{}
	if ev := fields["event"].GetStructValue(); ev != nil {
		event = ev.AsMap()
	}
	eventJSON, err := json.Marshal(event)
	if err != nil {
		return nil, fmt.Errorf("task %d event: %w", j.Task.GetId(), err)
	}
	secrets := j.Task.GetSecrets()
	token := secrets["GITEA_TOKEN"]
	if token == "" {
		token = secrets["GITHUB_TOKEN"]
	}
	if token == "" {
		token = j.str("token")
	}
	instance := strings.TrimSuffix(j.str("server_url"), "/")
	if instance == "" {
		return nil, fmt.Errorf("task %d has no server_url", j.Task.GetId())
	}
	env := map[string]string{
		"GITEA_ACTIONS":                "true",
		"GITEA_ACTIONS_RUNNER_VERSION": Version,
		"ACTIONS_RUNTIME_URL":          instance + "/api/actions_pipeline/",
		"ACTIONS_RESULTS_URL":          instance,
		"ACTIONS_RUNTIME_TOKEN":        j.str("gitea_runtime_token"),
	}
	if env["ACTIONS_RUNTIME_TOKEN"] == "" {
		env["ACTIONS_RUNTIME_TOKEN"] = j.str("token")
	}
	if opt.CacheURL != "" {
		env["ACTIONS_CACHE_URL"] = opt.CacheURL
	}
	if u := j.str("actions_id_token_request_url"); u != "" {
		env["ACTIONS_ID_TOKEN_REQUEST_URL"] = u
		env["ACTIONS_ID_TOKEN_REQUEST_TOKEN"] = j.str("actions_id_token_request_token")
	}
	for k, v := range j.env {
		env[k] = v
	}
	return &runner.Config{
		Workdir:               opt.WorkDir,
		ActionCacheDir:        opt.CacheDir,
		BindWorkdir:           false,
		LogOutput:             true,
		AutoRemove:            true,
		NoSkipCheckout:        true,
		Env:                   env,
		Secrets:               secrets,
		Vars:                  j.Task.GetVars(),
		Token:                 token,
		InsecureSecrets:       false,
		GitHubInstance:        instance,
		DefaultActionInstance: j.str("gitea_default_actions_url"),
		PlatformPicker:        func([]string) string { return "-self-hosted" },
		EventJSON:             string(eventJSON),
		PresetGitHubContext: &model.GithubContext{
			Event:           event,
			RunID:           j.str("run_id"),
			RunNumber:       j.str("run_number"),
			RunAttempt:      j.str("run_attempt"),
			Actor:           j.str("actor"),
			EventName:       j.str("event_name"),
			Repository:      j.str("repository"),
			RepositoryOwner: j.str("repository_owner"),
			Sha:             j.str("sha"),
			Ref:             j.str("ref"),
			RefName:         j.str("ref_name"),
			RefType:         j.str("ref_type"),
			HeadRef:         j.str("head_ref"),
			BaseRef:         j.str("base_ref"),
			RetentionDays:   j.str("retention_days"),
			Token:           token,
		},
	}, nil
}

// deadline is the earliest of the executor's end, Gitea's endless-task
// limit and the job's timeout-minutes.
func (j *Job) deadline(opt Options) time.Time {
	claimed := opt.Claimed
	if claimed.IsZero() {
		claimed = time.Now()
	}
	d := claimed.Add(3*time.Hour - endlessMargin)
	if !opt.Deadline.IsZero() && opt.Deadline.Before(d) {
		d = opt.Deadline
	}
	if m, err := strconv.ParseFloat(strings.TrimSpace(j.job.TimeoutMinutes), 64); err == nil && m > 0 {
		if t := time.Now().Add(time.Duration(m * float64(time.Minute))); t.Before(d) {
			d = t
		}
	}
	return d
}

// discardFactory gives act a job logger that writes nowhere: the reporter,
// as the hook, sees every entry (at Trace: skipped-step results come at
// Debug).
type discardFactory struct{}

func (discardFactory) WithJobLogger() *logrus.Logger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	l.SetLevel(logrus.TraceLevel)
	return l
}

// dockerDaemonError starts what act logs when a step needs the Docker
// daemon (the docker client's connection error).
const dockerDaemonError = "Cannot connect to the Docker daemon"

// daemonless is the job's log hook: every entry goes to the reporter, with
// act's "Cannot connect to the Docker daemon at unix:///var/run/docker.sock"
// said as what it means here. It is how a Docker action (`runs.using:
// docker`) fails: act knows an action needs Docker only once it has read
// the action, and fails its step at once.
type daemonless struct{ Reporter }

func (d daemonless) Fire(e *logrus.Entry) error {
	if strings.HasPrefix(e.Message, dockerDaemonError) {
		e.Message = "this step runs a Docker action (`runs.using: docker`), which needs a Docker daemon, and this executor has none: " + noDaemon
	}
	return d.Reporter.Fire(e)
}

// Run executes the job and hands its outputs to r. The error is for the
// last words of the job log: the job's own result reaches Gitea through r.
// A panic inside act becomes an error, not a crash.
func (j *Job) Run(ctx context.Context, r Reporter, opt Options) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("the runner failed: %v", p)
		}
	}()
	cfg, err := j.config(opt)
	if err != nil {
		return err
	}
	for _, dir := range []string{opt.WorkDir, opt.CacheDir} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
	}
	// act logs through logrus' standard logger too; keep it quiet and off
	// the job log (where it writes is the runner's to say).
	logrus.SetLevel(logrus.WarnLevel)
	if j.docker != "" {
		restore, err := j.stepDocker(cfg, opt)
		if err != nil {
			return err
		}
		defer restore()
	}

	act, err := runner.New(cfg)
	if err != nil {
		return fmt.Errorf("act: %w", err)
	}
	jobCtx, cancel := context.WithDeadline(r.JobContext(), j.deadline(opt))
	defer cancel()
	jobCtx = common.WithLoggerHook(jobCtx, daemonless{r})
	jobCtx = runner.WithJobLoggerFactory(jobCtx, discardFactory{})
	r.Logf("received task %d of job %s, triggered by event: %s", j.Task.GetId(), j.ID, j.str("event_name"))
	r.Logf("workflow prepared")
	if len(j.services) > 0 {
		err := jobservices.WaitReady(jobCtx, j.services, j.serviceTimeout, func(service string, port jobservices.Port) {
			r.Logf("waiting for service %s on 127.0.0.1:%d", service, port)
		})
		if err != nil {
			return fmt.Errorf("the job's services are not ready: %w", err)
		}
		r.Logf("services ready: %s", strings.Join(jobservices.IDs(j.services), ", "))
	}
	execErr := act.NewPlanExecutor(j.plan)(jobCtx)
	r.SetOutputs(j.job.Outputs)
	if errors.Is(jobCtx.Err(), context.DeadlineExceeded) && r.JobContext().Err() == nil {
		return fmt.Errorf("the job reached its deadline")
	}
	return execErr
}

// stepDocker gives act the executor's daemon for the steps that are images,
// through a stepdocker.Proxy binding the task's folders (the workspace and
// act's files are under them), and the job's steps the daemon itself
// (DOCKER_HOST). act's Docker client reads DOCKER_HOST from the process
// environment and from nothing else, so stepDocker sets it there until
// restore: a runner process runs one task, and act copies that environment
// into the steps' only where the job's own (cfg.Env) has no such name.
func (j *Job) stepDocker(cfg *runner.Config, opt Options) (restore func(), err error) {
	proxy, err := stepdocker.Start(j.docker, stepdocker.Options{
		Binds:   []string{filepath.Clean(opt.WorkDir), filepath.Clean(opt.CacheDir)},
		HostEnv: os.Environ(),
	})
	if err != nil {
		return nil, err
	}
	cfg.Env["DOCKER_HOST"] = j.docker
	// A step container gets the daemon's socket at /var/run/docker.sock, as
	// beside a job container; a daemon reached over TCP, none.
	cfg.ContainerDaemonSocket = "-"
	if strings.HasPrefix(j.docker, "unix://") {
		cfg.ContainerDaemonSocket = j.docker
	}
	prev, had := os.LookupEnv("DOCKER_HOST")
	if err := os.Setenv("DOCKER_HOST", proxy.Host); err != nil {
		_ = proxy.Close()
		return nil, err
	}
	return func() {
		if had {
			_ = os.Setenv("DOCKER_HOST", prev)
		} else {
			_ = os.Unsetenv("DOCKER_HOST")
		}
		_ = proxy.Close()
	}, nil
}

// TaskDir returns a fresh per-task work directory under base.
func TaskDir(base string, taskID int64) string {
	return filepath.Join(base, "task-"+strconv.FormatInt(taskID, 10))
}
