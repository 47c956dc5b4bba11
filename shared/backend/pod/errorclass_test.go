package pod

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/executor"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskassignment"
	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/taskidentity"
)

// TestCreateErrorClasses: what no retry can fix is permanent (the task is
// failed at once), what an operator or time can fix stays transient.
func TestCreateErrorClasses(t *testing.T) {
	podsGR := schema.GroupResource{Resource: "pods"}
	for _, tc := range []struct {
		name      string
		pool      string
		podErr    error       // returned by the API server for the Pod create
		existing  *corev1.Pod // a Pod already stored under the executor's name
		permanent bool
	}{
		{name: "invalid Pod (422)", pool: "linux", podErr: apierrors.NewInvalid(schema.GroupKind{Kind: "Pod"}, "gdr-linux-7",
			field.ErrorList{field.Invalid(field.NewPath("spec", "containers").Index(0).Child("image"), "bad image", "invalid reference format")}), permanent: true},
		{name: "pool not of this backend", pool: "sandbox", permanent: true},
		{name: "unknown pool", pool: "gpu", permanent: true},
		{name: "name taken by another assignment", pool: "linux", existing: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{
			Name: "gdr-linux-7", Namespace: "ci", Labels: map[string]string{"ci.example.org/assignment-id": "linux-8"}}}, permanent: true},
		{name: "forbidden (RBAC, quota)", pool: "linux", podErr: apierrors.NewForbidden(podsGR, "gdr-linux-7", nil)},
		{name: "internal error (5xx)", pool: "linux", podErr: apierrors.NewInternalError(context.DeadlineExceeded)},
		{name: "server timeout", pool: "linux", podErr: apierrors.NewServerTimeout(podsGR, "create", 1)},
		{name: "too many requests", pool: "linux", podErr: apierrors.NewTooManyRequests("slow down", 1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			var objs []runtime.Object
			if tc.existing != nil {
				objs = append(objs, tc.existing)
			}
			client := fake.NewClientset(objs...)
			if tc.podErr != nil {
				client.PrependReactor("create", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
					return true, nil, tc.podErr
				})
			}
			cfg.Client = client
			b, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			id, err := taskidentity.New(cfg.TrustDomain, "Owner/Repo", "build", 7)
			if err != nil {
				t.Fatal(err)
			}
			a, err := taskassignment.New(taskassignment.BackendPod, taskassignment.Task{ID: 7, Pool: tc.pool}, id)
			if err != nil {
				t.Fatal(err)
			}
			_, err = b.Create(context.Background(), a, launch(cfg.Keys, a))
			if err == nil {
				t.Fatal("Create succeeded")
			}
			if got := executor.IsPermanent(err); got != tc.permanent {
				t.Fatalf("IsPermanent(%v) = %v, want %v", err, got, tc.permanent)
			}
		})
	}
}
