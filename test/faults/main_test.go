// Package faults is a Jepsen-style fault suite: real `cgledger serve`,
// nats-server and tool-service processes under load, killed with SIGKILL at
// random points and restarted, then checked call by call against the ledger's
// export: every acknowledged call has exactly one report, no call has two,
// and no dispatched command is left without a report.
//
// Profiles: `go test ./test/faults/` runs the short profile (3 kills per
// fault, a few hundred calls). CGLEDGER_FAULTS_ITERATIONS sets the number of
// kills per fault (the long profile: `make faults`), CGLEDGER_FAULTS_SEED the
// seed of the random kill points, printed by every run so a failure can be
// replayed.
package faults

import (
	"flag"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

var (
	cgledgerBin   string
	natsServerBin string
	toolsvcBin    string
	payexecBin    string

	seed       uint64
	iterations int
	// callsPerRun is how many calls each fault's load generator makes.
	callsPerRun int
)

const (
	shortIterations = 3
	shortCalls      = 240
)

func TestMain(m *testing.M) {
	flag.Parse()
	// The faults spend most of their time waiting on other processes (a
	// restart, an ack wait), so they run side by side even on two cores:
	// raise -parallel unless it was given on the command line.
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given {
		_ = flag.Set("test.parallel", "4")
	}

	seed = uint64(time.Now().UnixNano())
	if v := os.Getenv("CGLEDGER_FAULTS_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			fmt.Fprintf(os.Stderr, "CGLEDGER_FAULTS_SEED=%q: %v\n", v, err)
			os.Exit(2)
		}
		seed = n
	}
	iterations = shortIterations
	if v := os.Getenv("CGLEDGER_FAULTS_ITERATIONS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "CGLEDGER_FAULTS_ITERATIONS=%q: want a positive integer\n", v)
			os.Exit(2)
		}
		iterations = n
	}
	callsPerRun = max(shortCalls, 40*iterations)
	fmt.Printf("faults: seed=%d iterations=%d calls=%d (replay: CGLEDGER_FAULTS_SEED=%d CGLEDGER_FAULTS_ITERATIONS=%d)\n",
		seed, iterations, callsPerRun, seed, iterations)

	dir, err := os.MkdirTemp("", "cgledger-faults-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	cgledgerBin = filepath.Join(dir, "cgledger")
	natsServerBin = filepath.Join(dir, "nats-server")
	toolsvcBin = filepath.Join(dir, "toolsvc")
	payexecBin = filepath.Join(dir, "payexec")
	for _, b := range []struct{ out, pkg string }{
		{cgledgerBin, "github.com/cgledger/cgledger/cmd/cgledger"},
		{natsServerBin, "github.com/nats-io/nats-server/v2"},
		{toolsvcBin, "github.com/cgledger/cgledger/test/faults/toolsvc"},
		{payexecBin, "github.com/cgledger/cgledger/test/faults/payexec"},
	} {
		build := exec.Command("go", "build", "-o", b.out, b.pkg)
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintf(os.Stderr, "build %s: %v\n", b.pkg, err)
			os.RemoveAll(dir)
			os.Exit(2)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// testRand is the random source of one test: the run's seed mixed with the
// test's name, so replaying a seed replays every test's kill points.
func testRand(t *testing.T) *rand.Rand {
	h := fnv.New64a()
	_, _ = h.Write([]byte(t.Name()))
	t.Logf("faults: %s seed=%d iterations=%d calls=%d (replay: CGLEDGER_FAULTS_SEED=%d CGLEDGER_FAULTS_ITERATIONS=%d go test -run '^%s$' ./test/faults/)",
		t.Name(), seed, iterations, callsPerRun, seed, iterations, t.Name())
	return rand.New(rand.NewPCG(seed, h.Sum64()))
}

// killGaps returns, for n kills, how much progress (acknowledged calls, or
// reports) to wait for after the previous restart before each kill: random,
// and together at most 4/5 of calls, so every kill lands under load.
func killGaps(rng *rand.Rand, n, calls int) []int {
	gaps := make([]int, n)
	for i := range gaps {
		gaps[i] = 1 + rng.IntN(max(1, calls*4/5/n))
	}
	return gaps
}

// jitter is the random delay between reaching a kill point and the kill, so
// that the SIGKILL lands at a random step of the calls in flight. It is the
// fault's timing, not a synchronisation.
func jitter(rng *rand.Rand) {
	<-time.After(time.Duration(rng.IntN(40)) * time.Millisecond)
}
