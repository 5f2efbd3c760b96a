package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// sysTree writes files (path under root: content) into a fresh root.
func sysTree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, c := range files {
		full := filepath.Join(root, p)
		require.NoError(t, os.MkdirAll(filepath.Dir(full), 0o755))
		require.NoError(t, os.WriteFile(full, []byte(c), 0o644))
	}
	return root
}

const meminfo24G = "MemFree:         1000 kB\nMemTotal:       25165824 kB\nBuffers: 12 kB\n"

func TestAvailableMemoryTakesTheLowerOfCgroupAndMachine(t *testing.T) {
	cases := []struct {
		name  string
		files map[string]string
		want  uint64
		from  string
	}{
		{"machine only", map[string]string{"proc/meminfo": meminfo24G}, 24 << 30, "MemTotal"},
		{"cgroup v2 limit below the machine", map[string]string{"proc/meminfo": meminfo24G, "sys/fs/cgroup/memory.max": "2147483648\n"}, 2 << 30, "/sys/fs/cgroup/memory.max"},
		{"cgroup v2 without a limit", map[string]string{"proc/meminfo": meminfo24G, "sys/fs/cgroup/memory.max": "max\n"}, 24 << 30, "MemTotal"},
		{"cgroup v2 above the machine", map[string]string{"proc/meminfo": meminfo24G, "sys/fs/cgroup/memory.max": "68719476736\n"}, 24 << 30, "MemTotal"},
		{"cgroup v1 limit", map[string]string{"proc/meminfo": meminfo24G, "sys/fs/cgroup/memory/memory.limit_in_bytes": "4294967296\n"}, 4 << 30, "/sys/fs/cgroup/memory/memory.limit_in_bytes"},
		{"cgroup v1 without a limit", map[string]string{"proc/meminfo": meminfo24G, "sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n"}, 24 << 30, "MemTotal"},
		{"cgroup limit, machine unknown", map[string]string{"sys/fs/cgroup/memory.max": "2147483648"}, 2 << 30, "/sys/fs/cgroup/memory.max"},
		{"nothing readable", map[string]string{"proc/meminfo": "MemTotal: lots kB\n"}, 0, ""},
		{"cgroup v2 limit on the process's own cgroup", map[string]string{"proc/meminfo": meminfo24G,
			"proc/self/cgroup": "0::/system.slice/cgledger.service\n", "sys/fs/cgroup/memory.max": "max\n",
			"sys/fs/cgroup/system.slice/cgledger.service/memory.max": "3221225472\n"}, 3 << 30, "/sys/fs/cgroup/system.slice/cgledger.service/memory.max"},
		{"cgroup v2 ancestor lower than its child", map[string]string{"proc/meminfo": meminfo24G,
			"proc/self/cgroup": "0::/system.slice/cgledger.service\n", "sys/fs/cgroup/system.slice/memory.max": "2147483648\n",
			"sys/fs/cgroup/system.slice/cgledger.service/memory.max": "3221225472\n"}, 2 << 30, "/sys/fs/cgroup/system.slice/memory.max"},
		{"cgroup v1 limit on the process's own cgroup", map[string]string{"proc/meminfo": meminfo24G,
			"proc/self/cgroup":                                         "9:name=systemd:/\n5:memory:/process_api/x\n4:cpu,cpuacct:/\n",
			"sys/fs/cgroup/memory/memory.limit_in_bytes":               "9223372036854771712\n",
			"sys/fs/cgroup/memory/process_api/x/memory.limit_in_bytes": "8589934592\n"}, 8 << 30, "/sys/fs/cgroup/memory/process_api/x/memory.limit_in_bytes"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, from := availableMemory(sysTree(t, c.files))
			require.Equal(t, c.want, got)
			require.Equal(t, c.from, from)
		})
	}
}

// On the host itself (root /) the file is named as it is, not //sys/...
func TestLowestLimitNamesTheFileFromRoot(t *testing.T) {
	root := sysTree(t, map[string]string{"sys/fs/cgroup/a/memory.max": "1073741824"})
	n, from := lowestLimit(filepath.Join(root, "sys", "fs", "cgroup"), "/a", "memory.max", root)
	require.Equal(t, uint64(1<<30), n)
	require.Equal(t, "/sys/fs/cgroup/a/memory.max", from)
	n, from = lowestLimit("/nonexistent-cgroup-root", "/a", "memory.max", "/")
	require.Zero(t, n)
	require.Empty(t, from)
}

func TestResolveMemoryLimit(t *testing.T) {
	old := sysRoot
	t.Cleanup(func() { sysRoot = old })

	sysRoot = sysTree(t, map[string]string{"proc/meminfo": meminfo24G})
	n, from := resolveMemoryLimit("auto")
	require.Equal(t, uint64(6<<30), n, "a quarter of the machine")
	require.Contains(t, from, "auto")

	sysRoot = sysTree(t, map[string]string{"proc/meminfo": meminfo24G, "sys/fs/cgroup/memory.max": "2147483648"})
	n, _ = resolveMemoryLimit("auto")
	require.Equal(t, uint64(1<<30), n, "never below 1 GiB")

	sysRoot = sysTree(t, map[string]string{"proc/meminfo": meminfo24G, "sys/fs/cgroup/memory.max": "536870912"})
	n, _ = resolveMemoryLimit("auto")
	require.Equal(t, uint64(256<<20), n, "a small cgroup: never more than half of it")

	sysRoot = t.TempDir()
	n, from = resolveMemoryLimit("auto")
	require.Equal(t, uint64(1<<30), n, "unknown memory: 1 GiB")
	require.Contains(t, from, "unknown")

	n, from = resolveMemoryLimit("3GiB")
	require.Equal(t, uint64(3<<30), n)
	require.Equal(t, "memory_limit", from)
	n, _ = resolveMemoryLimit("off")
	require.Zero(t, n)
}
