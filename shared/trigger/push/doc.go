// Package push holds the trigger adapters that are pushed to: the Knative
// mode's, one CloudEvent per HTTP request. Assignments is handle's (a
// Subscription of the assignments' channel), DeadLetters recover's (the
// dead-letter sink, and the reply of a rejection). An adapter has a core
// decide each event (shared/handler, shared/recoverer) and answers it so
// that Knative carries the decision out: a 2xx acknowledges, a 5xx
// redelivers, another 4xx drops, and a reply event goes on to the
// Subscription's reply. The cores see no event.
package push
