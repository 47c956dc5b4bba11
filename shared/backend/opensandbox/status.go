package opensandbox

import (
	"context"
	"strings"
)

// WaitReason says why assignmentID's sandbox has not started its job, for a
// status report (read only: one list): its state, with the server's reason
// and message when it gives them ("sandbox Pending: ImagePulling: ...");
// "" when the assignment has no sandbox.
func (b *Backend) WaitReason(ctx context.Context, assignmentID string) (string, error) {
	sandboxes, err := b.list(ctx, assignmentID)
	if err != nil || len(sandboxes) == 0 {
		return "", err
	}
	s := b.pick(sandboxes)
	why := "sandbox " + string(s.State)
	if detail := strings.Trim(s.Reason+": "+s.Message, ": "); detail != "" {
		why += ": " + detail
	}
	return why, nil
}
