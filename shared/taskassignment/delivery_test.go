package taskassignment

import (
	"strings"
	"testing"
)

func TestReasons(t *testing.T) {
	long := strings.Repeat("é", 400) // 800 bytes
	tests := []struct {
		name                string
		reason              string
		id, why             string
		exhausted, parsedOK bool
	}{
		{"rejected", RejectedReason("linux-7", "pool \"gpu\" is not a pod pool"), "linux-7", "pool \"gpu\" is not a pod pool", false, true},
		{"rejected, several lines", RejectedReason("linux-7", "Pod is invalid:\n  spec.image: Required\r\n"), "linux-7", "Pod is invalid:; spec.image: Required", false, true},
		{"rejected, long", RejectedReason("linux-7", long), "linux-7", strings.Repeat("é", 254) + "...", false, true},
		{"exhausted", ExhaustedReason("linux-7"), "linux-7", "deliveries exhausted", true, true},
		{"exhausted, no ID", ExhaustedReason(""), "", "", false, false},
		{"poison", "malformed assignment", "", "", false, false},
		{"no such kind", "forged linux-7: x", "", "", false, false},
		{"not an ID", "permanent linux: x", "", "", false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id, why, exhausted, ok := Rejection{Kind: Terminated, Reason: tt.reason}.Cause()
			if id != tt.id || why != tt.why || exhausted != tt.exhausted || ok != tt.parsedOK {
				t.Fatalf("Cause(%q) = %q, %q, %v, %v; want %q, %q, %v, %v", tt.reason, id, why, exhausted, ok, tt.id, tt.why, tt.exhausted, tt.parsedOK)
			}
			if len(why) > MaxReasonBytes {
				t.Fatalf("why is %d bytes", len(why))
			}
		})
	}
}

func TestFinishedNoticeRejects(t *testing.T) {
	for _, body := range []string{"", "linux", "linux-0", strings.Repeat("a", 300) + "-1"} {
		if id, err := FinishedNotice([]byte(body)); err == nil {
			t.Errorf("FinishedNotice(%.20q) = %q", body, id)
		}
	}
}
