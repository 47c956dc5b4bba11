package assignmentsig

import (
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
)

// BenchmarkDecode is what handle did per message before assignments were
// signed (the reference); BenchmarkOpenAndDecode is what it does now. Run
// both in one command to compare:
//
//	go test -run='^$' -bench='Decode' -benchmem ./shared/assignmentsig/
func BenchmarkDecode(b *testing.B) {
	td := spiffeid.RequireTrustDomainFromString("ci.example.org")
	for b.Loop() {
		if _, err := taskassignment.Decode([]byte(message), td); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkOpenAndDecode(b *testing.B) {
	td := spiffeid.RequireTrustDomainFromString("ci.example.org")
	s := signer(b, 1)
	ring, err := NewKeyring(s.Public(), signer(b, 2).Public())
	if err != nil {
		b.Fatal(err)
	}
	sealed, err := s.Seal([]byte(message))
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		msg, err := ring.Open(sealed)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := taskassignment.Decode(msg, td); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkSeal(b *testing.B) {
	s := signer(b, 1)
	for b.Loop() {
		if _, err := s.Seal([]byte(message)); err != nil {
			b.Fatal(err)
		}
	}
}
