// Package pull holds the trigger adapters that pull from JetStream: handle's
// (Assignments: the KEDA ScaledJob mode and local mode) and recover's finish
// mode (Notices). An adapter owns the message loop: it fetches, has a core
// decide each message (shared/handler, shared/recoverer), and carries the
// decision out: ack, nak with the decision's delay, hold (in-progress
// signals), terminate with the decision's reason, or terminate on the last
// delivery what it would otherwise hand back (Retry). The cores see no
// message; the crash windows of each adapter are documented on its Run.
package pull
