// Package chaos is the chaos run of the control plane (issue 13): many tasks
// through a real NATS server in its own process, restarted during the run
// with its file store kept; dispatch, handle and recover as real processes
// (the project's own binaries), killed with SIGKILL at random points; a
// scripted Gitea (Gitea) that speaks the runner protocol honestly and
// records every claim, final result and zombie reaping; and the OpenSandbox
// backend against its contract-checked fake, which records every sandbox
// ever created. Executors are simulated: once a sandbox exists, it reports
// its result as the runner would (through the gateway), or ends without
// reporting.
//
// The run is judged from those records, never from logs: every task has
// exactly one final result in Gitea and was not reaped as a zombie (else it
// is lost); no assignment's executor was created twice (else duplicated);
// and after one final recover pass no sandbox, no payload and no queued
// message is left (else leaked). TestChaos prints
//
//	chaos: <N> tasks, <K> kills, <L> lost, <D> duplicated, <X> leaked
//
// last, and fails unless L, D and X are 0.
package chaos
