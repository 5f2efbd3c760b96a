package main

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// storeLogEvery is the least time between two logs of one kind of view
// store event.
const storeLogEvery = 10 * time.Second

// backgroundErrorLog logs the view store's failed background writes (a
// memtable flush, a compaction): Pebble retries a failed flush without end,
// and a store that cannot flush the write-ahead log it replays (a full
// disk) holds serve's start with nothing else to say so.
func backgroundErrorLog(log *slog.Logger) func(error) {
	return rateLimitedLog(log, slog.LevelWarn, "view store: a background write failed; Pebble tries it again (on a full disk, serve waits for room)")
}

// corruptionLog logs the corruption Pebble finds reading the views (a
// block whose checksum does not match): the read that found it fails, and
// what mends it is the operator's (docs/operations.md).
func corruptionLog(log *slog.Logger) func(error) {
	return rateLimitedLog(log, slog.LevelError, "view store: a file of the views is corrupt; reads of it fail (stop serve and remove <data>/views: the next start restores or rebuilds them)")
}

// rateLimitedLog logs msg with each error at most once every
// storeLogEvery, with how many it left out since the last line.
func rateLimitedLog(log *slog.Logger, level slog.Level, msg string) func(error) {
	var mu sync.Mutex
	var last time.Time
	skipped := 0
	return func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if !last.IsZero() && time.Since(last) < storeLogEvery {
			skipped++
			return
		}
		// The message alone: formatted as a value, Pebble's errors carry
		// their stack traces (kilobytes on every line).
		log.Log(context.Background(), level, msg, "err", err.Error(), "left_out", skipped)
		last, skipped = time.Now(), 0
	}
}
