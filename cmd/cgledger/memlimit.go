package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/cgledger/cgledger/internal/diskspace"
)

// memoryLimitAuto is memory_limit's default: a share of the memory the
// process may use, never below memoryLimitFloor.
const memoryLimitAuto = "auto"

// memoryLimitShare is the part of the process's memory that auto gives the
// Go heap: the rest is the page cache the stream and the views read
// through, Pebble's own (C) memory and the other processes of the host.
const memoryLimitShare = 4

// memoryLimitFloor is the least auto sets (unless that is more than half of
// the process's memory), and what it sets where the memory cannot be read.
const memoryLimitFloor = 1 << 30

// sysRoot is where memory sizes are read from: / on a real host, a test's
// directory in tests.
var sysRoot = "/"

// resolveMemoryLimit returns the soft memory limit memory_limit asks for, in
// bytes (0 for off), and where it came from, for the start-up log.
func resolveMemoryLimit(setting string) (uint64, string) {
	switch setting {
	case "", "off":
		return 0, "off: no limit"
	case memoryLimitAuto:
		mem, from := availableMemory(sysRoot)
		if mem == 0 {
			return memoryLimitFloor, "auto: the machine's memory is unknown"
		}
		// The floor keeps a small limit's collector from running without
		// pause, yet never above half of what the process may use.
		return max(mem/memoryLimitShare, min(memoryLimitFloor, mem/2)), fmt.Sprintf("auto: a quarter of %d MiB (%s), at least the smaller of 1 GiB and half of it", mem>>20, from)
	}
	n, _ := diskspace.ParseSize(setting) // validated
	return n, "memory_limit"
}

// availableMemory is the memory this process may use: its cgroup's limit
// when one is set below the machine's memory, else the machine's memory
// (MemTotal); 0 when neither can be read.
func availableMemory(root string) (uint64, string) {
	total := memTotal(filepath.Join(root, "proc", "meminfo"))
	limit, from := cgroupLimit(root)
	if limit > 0 && (total == 0 || limit < total) {
		return limit, from
	}
	if total == 0 {
		return 0, ""
	}
	return total, "MemTotal"
}

// memTotal reads MemTotal from a /proc/meminfo, in bytes; 0 when absent.
func memTotal(path string) uint64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		v, ok := strings.CutPrefix(sc.Text(), "MemTotal:")
		if !ok {
			continue
		}
		kb, err := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
		if err != nil {
			return 0
		}
		return kb << 10
	}
	return 0
}

// cgroupLimit reads the memory limit of the process's cgroup, in bytes, and
// which file it came from; 0 when none is set. The limit in force is the
// lowest of the process's cgroup and its ancestors (a systemd unit's
// MemoryMax= sits on the unit's own cgroup, a container's on its root as
// the container sees it), under cgroup v2 (memory.max; "max" is none) or
// v1's memory controller (memory.limit_in_bytes; the largest page-aligned
// int64 is none). /proc/self/cgroup names the process's cgroup.
func cgroupLimit(root string) (uint64, string) {
	v2, v1 := "/", "/"
	if b, err := os.ReadFile(filepath.Join(root, "proc", "self", "cgroup")); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			parts := strings.SplitN(line, ":", 3)
			if len(parts) != 3 {
				continue
			}
			switch {
			case parts[0] == "0" && parts[1] == "":
				v2 = parts[2]
			case slices.Contains(strings.Split(parts[1], ","), "memory"):
				v1 = parts[2]
			}
		}
	}
	best, from := lowestLimit(filepath.Join(root, "sys", "fs", "cgroup"), v2, "memory.max", root)
	if best == 0 {
		best, from = lowestLimit(filepath.Join(root, "sys", "fs", "cgroup", "memory"), v1, "memory.limit_in_bytes", root)
	}
	return best, from
}

// lowestLimit reads file in the cgroup dir base+path and in each of its
// ancestors up to base, and returns the lowest limit set (0 for none) and
// the file it came from, named as on the host (without root).
func lowestLimit(base, path, file, root string) (uint64, string) {
	var best uint64
	from := ""
	for dir := filepath.Join(base, filepath.Clean("/"+path)); ; dir = filepath.Dir(dir) {
		if n := readLimit(filepath.Join(dir, file)); n > 0 && (best == 0 || n < best) {
			best, from = n, filepath.Join(dir, file)
			if rel, err := filepath.Rel(root, from); err == nil {
				from = "/" + rel
			}
		}
		if dir == base || !strings.HasPrefix(dir, base) {
			return best, from
		}
	}
}

// readLimit reads one cgroup memory limit file: 0 when it is missing, says
// "max", or holds v1's "no limit".
func readLimit(path string) uint64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	v := strings.TrimSpace(string(b))
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil || n >= 1<<62 {
		return 0
	}
	return n
}
