package main

import (
	"log/slog"
	"sync"
	"time"
)

// backgroundErrorEvery is the least time between two logs of the view
// store's failed background writes.
const backgroundErrorEvery = 10 * time.Second

// backgroundErrorLog logs the view store's failed background writes (a
// memtable flush, a compaction), at most one every backgroundErrorEvery
// with how many it left out: Pebble retries a failed flush without end, and
// a store that cannot flush the write-ahead log it replays (a full disk)
// holds serve's start with nothing else to say so.
func backgroundErrorLog(log *slog.Logger) func(error) {
	var mu sync.Mutex
	var last time.Time
	skipped := 0
	return func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if !last.IsZero() && time.Since(last) < backgroundErrorEvery {
			skipped++
			return
		}
		// The message alone: formatted as a value, Pebble's errors carry
		// their stack traces (kilobytes on every line).
		log.Warn("view store: a background write failed; Pebble tries it again (on a full disk, serve waits for room)",
			"err", err.Error(), "left_out", skipped)
		last, skipped = time.Now(), 0
	}
}
