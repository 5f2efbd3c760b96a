package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
)

// MountTmpfs mounts a tmpfs of sizeKB KiB on a new directory under the
// test's temporary directory and returns it; it is unmounted when the test
// ends. Without root the test is skipped (failed in CI).
func MountTmpfs(t testing.TB, sizeKB int) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "small")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+strconv.Itoa(sizeKB)+"k", "tmpfs", dir).CombinedOutput()
	if err != nil {
		Skip(t, "cannot mount a tmpfs here (needs root): %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", dir).Run() })
	return dir
}

// ResizeTmpfs sets the size of the tmpfs MountTmpfs mounted on dir.
func ResizeTmpfs(t testing.TB, dir string, sizeKB int) {
	t.Helper()
	if out, err := exec.Command("mount", "-o", "remount,size="+strconv.Itoa(sizeKB)+"k", dir).CombinedOutput(); err != nil {
		t.Fatalf("testenv: resize tmpfs %s: %v: %s", dir, err, out)
	}
}
