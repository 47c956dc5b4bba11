package executor_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
)

func TestPermanent(t *testing.T) {
	cause := errors.New("pod spec invalid")
	tests := []struct {
		name      string
		err       error
		permanent bool
		text      string
	}{
		{"nil", executor.Permanent(nil), false, ""},
		{"plain error", cause, false, "pod spec invalid"},
		{"marked", executor.Permanent(cause), true, "pod spec invalid"},
		{"marked, then wrapped", fmt.Errorf("create executor of assignment linux-1: %w", executor.Permanent(cause)), true,
			"create executor of assignment linux-1: pod spec invalid"},
		{"marked twice", executor.Permanent(executor.Permanent(cause)), true, "pod spec invalid"},
		{"joined with a transient one", errors.Join(context.DeadlineExceeded, executor.Permanent(cause)), true,
			"context deadline exceeded\npod spec invalid"},
		{"transient wrapped", fmt.Errorf("find: %w", context.DeadlineExceeded), false, "find: context deadline exceeded"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := executor.IsPermanent(tt.err); got != tt.permanent {
				t.Errorf("IsPermanent = %v, want %v", got, tt.permanent)
			}
			if tt.err == nil {
				return
			}
			if tt.err.Error() != tt.text {
				t.Errorf("text = %q, want %q", tt.err.Error(), tt.text)
			}
			if tt.permanent && !errors.Is(tt.err, cause) {
				t.Errorf("the cause is lost in %v", tt.err)
			}
		})
	}
}
