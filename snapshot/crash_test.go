package snapshot

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/projector"
)

// crashEnv names the variable that makes the test binary a crash helper:
// it holds a crashJob.
const crashEnv = "CGLEDGER_SNAPSHOT_CRASH_JOB"

// crashJob is what a crash helper process does: take a snapshot of
// ViewsDir, or restore one into RestoreDir, and stop for good at Step,
// announcing it on stdout so the test kills it there.
type crashJob struct {
	Op         string `json:"op"` // "take" or "restore"
	Step       string `json:"step"`
	Target     string `json:"target"` // "dir" or "objectstore"
	NATSURL    string `json:"nats_url"`
	Bucket     string `json:"bucket"`
	TargetDir  string `json:"target_dir"`
	ViewsDir   string `json:"views_dir"`
	RestoreDir string `json:"restore_dir"`
	TempDir    string `json:"temp_dir"`
}

// crashLine is the line a helper prints when it reaches its step.
func crashLine(step string) string { return "crash helper at " + step }

func TestMain(m *testing.M) {
	if raw := os.Getenv(crashEnv); raw != "" {
		if err := runCrashJob(raw); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		fmt.Println("crash helper finished without reaching its step")
		os.Exit(3)
	}
	os.Exit(m.Run())
}

// runCrashJob is the crash helper's main.
func runCrashJob(raw string) error {
	var job crashJob
	if err := json.Unmarshal([]byte(raw), &job); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	nc, err := nats.Connect(job.NATSURL)
	if err != nil {
		return err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	var tg Target
	if job.Target == "dir" {
		tg, err = NewDir(job.TargetDir)
	} else {
		var o *ObjectStore
		o, err = NewObjectStore(ctx, js, job.Bucket, 1)
		if o != nil {
			o.chunkSize, tg = 1024, o
		}
	}
	if err != nil {
		return err
	}
	stepHook = func(step string) {
		if step != job.Step {
			return
		}
		// Publishes are asynchronous: the kill comes once the server has
		// stored chunks of this upload (beside the good object's).
		if job.Target == "objectstore" && step == "uploading" {
			if err := waitChunkSubjects(ctx, js, job.Bucket, 2); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(2)
			}
		}
		fmt.Println(crashLine(step))
		_ = os.Stdout.Sync()
		select {}
	}
	switch job.Op {
	case "take":
		s, err := projector.OpenStore(job.ViewsDir, projector.StoreOptions{})
		if err != nil {
			return err
		}
		_, err = Take(ctx, s, tg, TakeOptions{Stream: ledgerStream, TempDir: job.TempDir})
		return err
	case "restore":
		_, err := Restore(ctx, tg, job.RestoreDir, RestoreOptions{Stream: ledgerStream, JS: js})
		return err
	}
	return fmt.Errorf("unknown op %q", job.Op)
}

// runUntilKilled runs the crash helper for job and kills it with SIGKILL
// when it announces its step.
func runUntilKilled(t *testing.T, job crashJob) {
	t.Helper()
	raw, err := json.Marshal(job)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), crashEnv+"="+string(raw))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	sc := bufio.NewScanner(out)
	reached := false
	for sc.Scan() {
		if sc.Text() == crashLine(job.Step) {
			reached = true
			require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
			break
		}
	}
	err = cmd.Wait()
	require.True(t, reached, "the helper did not reach %s: %v\n%s", job.Step, err, stderr.String())
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit)
	require.Equal(t, syscall.SIGKILL, exit.Sys().(syscall.WaitStatus).Signal(), "killed by SIGKILL")
}

// A process killed at every step of a snapshot or a restore leaves no
// snapshot listed that is not whole, no half-restored views, and the next
// restore succeeds.
func TestKillAtEveryStep(t *testing.T) {
	e := ledgertest.New(t)
	ctx := ledgertest.Ctx(t)
	e.Scenario(t, 10)
	viewsDir := filepath.Join(t.TempDir(), "views")
	s, err := projector.OpenStore(viewsDir, projector.StoreOptions{})
	require.NoError(t, err)
	catchUp(t, ctx, e, s)
	for kind, tg := range targets(t, ctx, e, "snaps_crash") {
		good, err := Take(ctx, s, tg, TakeOptions{Stream: ledgerStream})
		require.NoError(t, err)
		job := crashJob{Target: kind, NATSURL: e.Srv.URL(), Bucket: "snaps_crash", ViewsDir: viewsDir}
		if d, ok := tg.(*Dir); ok {
			job.TargetDir = d.path
		}
		requireRestores := func(t *testing.T) {
			t.Helper()
			dir := filepath.Join(t.TempDir(), "views")
			m, err := Restore(ctx, tg, dir, restoreOpts(e))
			require.NoError(t, err)
			require.Equal(t, good.Name, m.Name)
			v, err := projector.OpenCheckpoint(dir)
			require.NoError(t, err)
			d, err := v.DigestNow()
			require.NoError(t, err)
			require.NoError(t, v.Close())
			require.Equal(t, good.Digest, d.Digest)
		}
		for _, step := range []string{"checkpointed", "uploading"} {
			t.Run(kind+"/take/"+step, func(t *testing.T) {
				// The helper opens the views: this process lets go of them.
				require.NoError(t, s.Close())
				defer func() { s, err = projector.OpenStore(viewsDir, projector.StoreOptions{}); require.NoError(t, err) }()
				job := job
				job.Op, job.Step, job.TempDir = "take", step, t.TempDir()
				runUntilKilled(t, job)
				left, err := filepath.Glob(filepath.Join(job.TempDir, checkpointPrefix+"*"))
				require.NoError(t, err)
				require.Len(t, left, 1, "the killed take's checkpoint")
				if step == "uploading" {
					requireUploadLeftover(t, ctx, e, tg)
				}
				listed, err := tg.List(ctx)
				require.NoError(t, err)
				require.Equal(t, []string{good.Name}, names(listed), "no partial snapshot listed")
				requireRestores(t)
				switch tg := tg.(type) {
				case *Dir:
					tg.staleAfter = 0
				case *ObjectStore:
					tg.orphanAfter = 0
				}
				_, err = Prune(ctx, tg, 1)
				require.NoError(t, err)
				requireOnlyGood(t, ctx, e, tg, good)
			})
		}
		for _, step := range []string{"unpacking", "unpacked"} {
			t.Run(kind+"/restore/"+step, func(t *testing.T) {
				parent := t.TempDir()
				job := job
				job.Op, job.Step, job.RestoreDir = "restore", step, filepath.Join(parent, "views")
				runUntilKilled(t, job)
				_, err := os.Stat(job.RestoreDir)
				require.ErrorIs(t, err, os.ErrNotExist, "no half-restored views")
				left, err := filepath.Glob(filepath.Join(parent, restoreTempPrefix+"*"))
				require.NoError(t, err)
				require.Len(t, left, 1, "the killed restore's unpack directory")
				m, err := Restore(ctx, tg, job.RestoreDir, restoreOpts(e))
				require.NoError(t, err)
				require.Equal(t, good.Name, m.Name)
				left, err = filepath.Glob(filepath.Join(parent, restoreTempPrefix+"*"))
				require.NoError(t, err)
				require.Empty(t, left, "the next restore removed it")
				d, err := openViews(t, job.RestoreDir).Digest()
				require.NoError(t, err)
				require.Equal(t, good.Digest, d)
			})
		}
	}
	require.NoError(t, s.Close())
}

// requireOnlyGood checks that tg holds good and nothing else: no file of
// a killed Put (directory), no chunk of a killed upload (object store).
func requireOnlyGood(t *testing.T, ctx context.Context, e *ledgertest.Env, tg Target, good Manifest) {
	t.Helper()
	switch tg := tg.(type) {
	case *Dir:
		ents, err := os.ReadDir(tg.path)
		require.NoError(t, err)
		var got []string
		for _, e := range ents {
			got = append(got, e.Name())
		}
		require.ElementsMatch(t, []string{good.Name + bodyExt, good.Name + manifestExt}, got)
	case *ObjectStore:
		st, err := e.JS.Stream(ctx, "OBJ_"+tg.bucket)
		require.NoError(t, err)
		info, err := st.Info(ctx, jetstream.WithSubjectFilter("$O."+tg.bucket+".C.>"))
		require.NoError(t, err)
		require.Len(t, info.State.Subjects, 1, "the good object's chunks only")
	}
}

// requireUploadLeftover checks that a killed upload left something for
// Prune to remove: a temporary body (directory), chunks no object names
// (object store).
func requireUploadLeftover(t *testing.T, ctx context.Context, e *ledgertest.Env, tg Target) {
	t.Helper()
	switch tg := tg.(type) {
	case *Dir:
		tmp, err := filepath.Glob(filepath.Join(tg.path, tempPrefix+"*.tmp"))
		require.NoError(t, err)
		require.Len(t, tmp, 1, "the killed Put's temporary body")
	case *ObjectStore:
		st, err := e.JS.Stream(ctx, "OBJ_"+tg.bucket)
		require.NoError(t, err)
		info, err := st.Info(ctx, jetstream.WithSubjectFilter("$O."+tg.bucket+".C.>"))
		require.NoError(t, err)
		require.Len(t, info.State.Subjects, 2, "the good object's chunks and the killed upload's")
	}
}

// waitChunkSubjects waits until the bucket's stream holds chunks on n
// subjects (n objects' worth), or ctx ends.
func waitChunkSubjects(ctx context.Context, js jetstream.JetStream, bucket string, n int) error {
	st, err := js.Stream(ctx, "OBJ_"+bucket)
	if err != nil {
		return err
	}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		info, err := st.Info(ctx, jetstream.WithSubjectFilter("$O."+bucket+".C.>"))
		if err != nil {
			return err
		}
		if len(info.State.Subjects) >= n {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("chunks on %d subjects, waited for %d: %w", len(info.State.Subjects), n, ctx.Err())
		case <-tick.C:
		}
	}
}
