// Package diskspace watches the free space of the file system that holds a
// data directory, so that writers stop before the disk is full instead of
// failing in the middle of a write (Pebble cannot continue after a failed
// WAL write; nats-server disables JetStream on "no space left").
package diskspace

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ErrLow is returned (wrapped) while free space is below the reserve.
var ErrLow = errors.New("storage nearly full")

// units are the suffixes ParseSize reads, with their multipliers.
var units = []struct {
	suffix string
	mult   uint64
}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40}}

// ParseSize reads a byte count: an integer, optionally followed by KiB, MiB,
// GiB or TiB, of at most MaxSize bytes. Spaces around it, or between the
// number and its unit, are ignored.
func ParseSize(s string) (uint64, error) {
	s = strings.TrimSpace(s)
	mult, unit := uint64(1), ""
	for _, u := range units {
		if strings.HasSuffix(s, u.suffix) {
			s, mult, unit = strings.TrimSuffix(s, u.suffix), u.mult, u.suffix
			break
		}
	}
	n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("not a size such as 64MiB (units KiB, MiB, GiB, TiB): %w", err)
	}
	if n > MaxSize/mult {
		return 0, fmt.Errorf("%w: %s%s is more than %d bytes", ErrSizeTooLarge, strings.TrimSpace(s), unit, uint64(MaxSize))
	}
	return n * mult, nil
}

// MaxSize is the largest size ParseSize reads: what an int64 holds, as file
// sizes and the Go runtime's memory limit are.
const MaxSize = 1<<63 - 1

// ErrSizeTooLarge is a size past MaxSize.
var ErrSizeTooLarge = errors.New("size too large")

// NoSpace reports whether err is a write refused for want of disk space
// (or of quota).
func NoSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// Space returns the free and total bytes of the file system that holds dir.
func Space(dir string) (free, total uint64, err error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, 0, fmt.Errorf("diskspace: statfs %s: %w", dir, err)
	}
	return st.Bavail * uint64(st.Bsize), st.Blocks * uint64(st.Bsize), nil
}

// Guard reports whether a directory's file system still has room. The zero
// value is not usable; use New.
type Guard struct {
	dir     string
	reserve uint64 // bytes; 0 means computed from the file system's size
	off     bool
	every   time.Duration

	mu      sync.Mutex
	checked time.Time
	err     error
	free    uint64
	// effective is the reserve in force at the last measure: the
	// configured one, or the one computed from the file system's size.
	effective uint64
	unknown   bool // the last measure could not read the file system
}

// New returns a guard for dir. reserve is the free space (bytes) below which
// writes must stop; zero means min(64 MiB, 10% of the file system). A guard
// made with off never refuses, but still measures (Free, Room).
func New(dir string, reserve uint64, off bool) *Guard {
	return &Guard{dir: dir, reserve: reserve, off: off, every: 250 * time.Millisecond}
}

// Room reports whether free space is above the reserve (for a guard that is
// off: above 1 MiB), whatever the guard's setting: when storage that broke
// may be reopened.
func (g *Guard) Room() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	err := g.measure()
	if g.off {
		return g.unknown || g.free > 1<<20
	}
	return err == nil
}

// Check returns nil while free space is above the reserve, else an error
// wrapping ErrLow that names the directory and the space left. The file
// system is asked at most every 250 ms; between asks the last answer stands.
func (g *Guard) Check() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if now := time.Now(); now.Sub(g.checked) >= g.every {
		g.checked = now
		g.err = g.measure()
	}
	if g.off {
		return nil
	}
	return g.err
}

// Free is the free space seen by the last check, in bytes.
func (g *Guard) Free() uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.free
}

// Reserve is the free space below which writes stop, in bytes, as of the
// last check (computed from the file system's size when none was set); 0
// for a guard that is off, which never stops them.
func (g *Guard) Reserve() uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.off {
		return 0
	}
	return g.effective
}

func (g *Guard) measure() error {
	free, total, err := Space(g.dir)
	g.unknown = err != nil
	if g.unknown {
		// Not knowing is not a reason to stop writing: the writes report
		// their own errors.
		return nil
	}
	g.free = free
	reserve := g.reserve
	if reserve == 0 {
		reserve = min(64<<20, total/10)
	}
	g.effective = reserve
	if free < reserve {
		return fmt.Errorf("%w: %d bytes free on the file system of %s (writes stop below %d; free space to resume)", ErrLow, free, g.dir, reserve)
	}
	return nil
}
