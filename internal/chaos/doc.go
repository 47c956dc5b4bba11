// Package chaos is the chaos run of the control plane (issue 13): many tasks
// through a real 3-node NATS JetStream cluster (nats-server processes,
// internal/testenv/natscluster; every stream and bucket R3), whose meta and
// stream leaders are SIGKILLed and restarted during the run with their
// stores kept, once a second server while a leader election is under way;
// dispatch, handle, recover and the gateway as real processes (the
// project's own binaries), killed with SIGKILL at random points; a
// scripted Gitea (Gitea) that speaks the runner protocol honestly and
// records every claim, final result, zombie reaping and call, with the
// process that made it (by the endpoint it came to); and the OpenSandbox
// backend against its contract-checked fake, which records every sandbox
// ever created and when each was removed. Executors are simulated: once a sandbox exists, it
// reports its result as the runner would (through the gateway), or ends
// without reporting; each records what it did (ExecRecord).
//
// The run is judged from those records, never from logs (verdict.go; each
// rule is a pure function with its own table of cases in verdict_test.go).
// Every task Gitea holds is judged once:
//
//   - lost: claimed other than once; or it has no final result, or was
//     reaped as a zombie, and its claim was not cut; or its final result is
//     neither its executor's own report nor a FAILURE with a reason (a log
//     row) for a task no executor reported on (a failure with no reason is
//     lost: the job's outcome is unaccounted for); or anyone but the reaper
//     sent it a final result differing from the one Gitea kept;
//   - wrongly-failed: its final result is ours (recover's report,
//     dispatch's Finalize), not its executor's, and an executor of it was
//     healthy: it reported (its result lost to ours), or was stopped (its
//     sandbox removed) before the task had any final result, or was alive
//     when our final result came (nobody cancels a task in this run), or
//     ended without its task (the gateway refused its fetch or never
//     answered it) while its payload was stored and the task had no final
//     result (the payload's removal read from its bucket's markers);
//   - cut (printed apart, no failure): Gitea's FetchTask answer carrying the
//     task went to a dispatch process (each process of the fleet is given
//     an endpoint of the scripted Gitea of its own, its GDR_GITEA_URL, so
//     the address a connection came to names the process that opened it,
//     however late Gitea accepts it) that was SIGKILLed at most CutWindow
//     (2 x dispatcher.ClaimTimeout) after the answer, made no later call for
//     the task's pool, and no payload of the task was ever written: the one
//     window Gitea's runner protocol leaves (see cutClaim).
//
// Beside the tasks: no assignment's executor was created twice (else
// duplicated); and after one final recover pass no sandbox, no payload and
// no queued message is left (else leaked). TestChaos prints
//
//	chaos: <N> tasks, <K> kills, <L> lost, <D> duplicated, <X> leaked, <W> wrongly-failed
//
// last, and fails unless L, D, X and W are 0 and, in a run of at least 50
// tasks, at least 75% of the tasks ended by their executor's own report
// (MinOwnShare).
//
// TestChaosGitea (build tag chaosgitea, `make chaos-gitea`) is the same kind
// of run against the real Gitea 1.27.3 (internal/testenv/giteaenv) and the
// real local mode binary (embedded NATS, process backend, gateway, runner):
// local mode SIGKILLed while jobs run and restarted on its state directory,
// Gitea SIGKILLed and restarted; judged by JudgeGitea (giteaverdict.go) from
// Gitea's API and what the process backend left, and it prints
//
//	chaos-gitea: <N> jobs, <K> kills, <G> gitea restarts, <L> lost, <W> wrongly-failed, <X> leaked
package chaos
