// Package knativepath is the end-to-end test of the Knative path: dispatch
// (GDR_PUBLISH=cloudevents) publishes each assignment as a CloudEvent to a
// NatsJetStreamChannel's ingress, the channel's dispatcher delivers it to
// handle in GDR_MODE=http, handle's process backend starts the executor, whose
// runner reports through the gateway to Gitea; recover in
// GDR_RECOVER_MODE=http runs a pass per tick and receives the channel's dead
// letters and handle's rejection replies at POST /dead-letter.
//
// Every function runs as its own process, built once by TestMain with `go
// build`, against a real Gitea (internal/testenv/giteaenv) and a real NATS
// JetStream server (internal/testenv/jetstreamenv, embedded in the test
// binary). No real Knative can be built here (the module proxy refuses
// knative.dev/*), so the channel is played by a stand-in: the harness of
// internal/testenv/channelenv, which stores every event it accepts
// in JetStream (Nats-Msg-Id = the event's id) and delivers it as
// eventing-natss's dispatcher does, with the delivery numbers of
// deploy/knative/10-channel.yaml (channelenv.LoadDelivery) unless a test
// says otherwise. Where handle would answer "not yet" (a Pod waiting for a
// node), a relay of the test's stands between the channel and handle and
// answers 503 itself: the process backend's executors never wait.
//
// The tests carry the build tag e2e and are named TestE2EKnative...; they
// need the Gitea peer `make peers` builds (skipped without it on a developer
// machine, failed under CI=true).
package knativepath
