package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
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

// memoryLimitFloor is the least auto sets, and what it sets where the
// machine's memory cannot be read.
const memoryLimitFloor = 1 << 30

// sysRoot is where memory sizes are read from: / on a real host, a test's
// directory in tests.
var sysRoot = "/"

// resolveMemoryLimit returns the soft memory limit memory_limit asks for, in
// bytes (0 for off), and where it came from, for the start-up log.
func resolveMemoryLimit(setting string) (uint64, string) {
	switch setting {
	case "", "off":
		return 0, "off"
	case memoryLimitAuto:
		mem, from := availableMemory(sysRoot)
		if mem == 0 {
			return memoryLimitFloor, "auto: the machine's memory is unknown"
		}
		return max(mem/memoryLimitShare, memoryLimitFloor), fmt.Sprintf("auto: a quarter of %d MiB (%s), at least 1 GiB", mem>>20, from)
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

// cgroupLimit reads the memory limit of the process's cgroup (v2's
// memory.max, else v1's memory.limit_in_bytes, as seen from inside the
// cgroup at /sys/fs/cgroup), in bytes, and which file it came from; 0 when
// none is set ("max", or v1's page-rounded maximum).
func cgroupLimit(root string) (uint64, string) {
	for _, f := range []string{"sys/fs/cgroup/memory.max", "sys/fs/cgroup/memory/memory.limit_in_bytes"} {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			continue
		}
		v := strings.TrimSpace(string(b))
		if v == "max" {
			return 0, ""
		}
		n, err := strconv.ParseUint(v, 10, 64)
		// cgroup v1 writes "no limit" as the largest page-aligned int64.
		if err != nil || n >= 1<<62 {
			return 0, ""
		}
		return n, "/" + f
	}
	return 0, ""
}
