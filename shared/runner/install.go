package runner

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/gitea-dynamic-runner/gitea-dynamic-runner/shared/function"
)

// install is `runner install <path>`: it copies this runner's executable to
// path, mode 0755. The runner image holds nothing but the runner, so an init
// container runs this to put it into a volume that the job's container (any
// image with a shell) then runs it from; no cp is needed in either image.
func install(args []string, stderr io.Writer) int {
	if len(args) != 1 {
		fmt.Fprintln(stderr, "usage: runner install <path>")
		return function.ExitConfig
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(stderr, "runner: install: %v\n", err)
		return function.ExitFailed
	}
	if err := copyExecutable(self, args[0]); err != nil {
		fmt.Fprintf(stderr, "runner: install: %v\n", err)
		return function.ExitFailed
	}
	return function.ExitOK
}

// copyExecutable copies src to dest with mode 0755, through a temporary file
// beside dest renamed into place: dest is the whole copy or is not there.
func copyExecutable(src, dest string) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("open %s: %w", src, err)
	}
	defer in.Close()
	tmp, err := os.CreateTemp(filepath.Dir(dest), "."+filepath.Base(dest)+".*")
	if err != nil {
		return fmt.Errorf("copy to %s: %w", dest, err)
	}
	defer os.Remove(tmp.Name()) // after the rename: nothing to remove
	_, err = io.Copy(tmp, in)
	if err == nil {
		err = tmp.Chmod(0o755)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if errClose := tmp.Close(); err == nil {
		err = errClose
	}
	if err == nil {
		err = os.Rename(tmp.Name(), dest)
	}
	if err != nil {
		return fmt.Errorf("copy %s to %s: %w", src, dest, err)
	}
	return nil
}
