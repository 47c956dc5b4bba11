// Package pickupfloor holds BenchmarkE2EPickupFloor (build tag e2e): against
// one real Gitea, how soon after a push a job is picked up by a bare
// FetchTask loop polling every 50 ms (Gitea's own floor), by local mode and
// by dispatch, with Gitea's default queue and with [queue] TYPE=channel. It
// needs both functions, so it lives here rather than in either; it runs them
// as the binaries users run. It has no code of its own.
package pickupfloor
