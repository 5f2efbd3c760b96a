package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/violationtest"
	"github.com/cgledger/cgledger/protocol"
)

// fields lists the fields of vs, sorted, once each.
func fields(vs protocol.Violations) []string {
	seen := map[string]bool{}
	var out []string
	for _, v := range vs {
		if !seen[v.Field] {
			seen[v.Field] = true
			out = append(out, v.Field)
		}
	}
	sort.Strings(out)
	return out
}

// TestDefaultSettingsAreValid: serve with no configuration at all starts.
func TestDefaultSettingsAreValid(t *testing.T) {
	require.Empty(t, defaultSettings().validate())
}

// TestValidateListsEveryViolation: every bad setting is its own violation,
// all in one answer, so that one run of check-config shows them all.
func TestValidateListsEveryViolation(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing.pem")
	s := defaultSettings()
	s.Data = ""
	s.NATSListen = "4222"
	s.Replicas = 7
	s.HTTPListen = "localhost"
	s.SyncInterval = "often"
	s.AckWait = "500ms"
	s.ToolAckWait = "2h"
	s.MCPStreamPollAfter = "10ms"
	s.Retention = "-1s"
	s.ArchiveSeal = "1ms"
	s.MemoryLimit = "1MiB"
	s.GCPercent = "5"
	s.DiskReserve = "lots"
	s.LogFormat = "xml"
	s.LogLevel = "loud"
	s.Roles = []string{"api", "cook"}
	s.MCPBridge = "bridge.yaml"
	s.PProf = "6060"
	s.TLSCert = missing
	s.TLSCA = missing
	s.SourceID = "has space"
	require.Equal(t, []string{
		"ack_wait", "archive_seal_age", "data", "disk_reserve", "gc_percent", "http_listen", "log_format", "log_level",
		"mcp_bridge", "mcp_stream_poll_after", "memory_limit", "nats_listen", "pprof", "replicas",
		"retention", "roles", "source_id", "sync_interval", "tls_ca", "tls_cert", "tool_ack_wait",
	}, fields(s.validate()))

	// With --nats-url the embedded server's settings are not checked, the
	// URL and the credentials file are.
	s = defaultSettings()
	s.Data, s.NATSListen, s.Replicas = "", "nonsense", 3
	s.NATSURL = "http://example.com"
	s.NATSCreds = missing
	require.Equal(t, []string{"nats_creds", "nats_url"}, fields(s.validate()))
	s.NATSURL = "nats://a:4222,nats://b:4222"
	s.NATSCreds = ""
	require.Empty(t, s.validate(), "a cluster of three with replicas 3")
}

// TestValidateRoleSettings: roles must be known and not empty; the mcp
// role and its bridge file go together.
func TestValidateRoleSettings(t *testing.T) {
	for _, c := range []struct {
		roles  []string
		bridge string
		want   []string
	}{
		{roles: nil, want: []string{"roles"}},
		{roles: []string{"api", "executor", "projector"}},
		{roles: []string{"mcp"}, want: []string{"mcp_bridge"}},
		{roles: []string{"api"}, bridge: "bridge.yaml", want: []string{"mcp_bridge"}},
		{roles: []string{"mcp"}, bridge: filepath.Join(t.TempDir(), "none.yaml"), want: []string{"mcp_bridge"}},
	} {
		s := defaultSettings()
		s.Roles, s.MCPBridge = c.roles, c.bridge
		require.Equal(t, c.want, fields(s.validate()), "roles %v, mcp_bridge %q", c.roles, c.bridge)
	}
}

// TestValidateArchiveSealAgainstRetention: the seal age is at most half of
// retention, so that every entry is sealed well before it expires.
func TestValidateArchiveSealAgainstRetention(t *testing.T) {
	for _, c := range []struct {
		retention, seal string
		ok              bool
	}{
		{"30d", "1h", true}, {"2h", "1h", true}, {"2h", "61m", false}, {"", "1h", true}, {"30d", "50ms", false},
	} {
		s := defaultSettings()
		s.Retention, s.ArchiveSeal = c.retention, c.seal
		require.Equal(t, !c.ok, len(s.validate()) > 0, "retention %q, archive_seal_age %q", c.retention, c.seal)
	}
}

// TestValidateGCPercent: gc_percent is a percentage from 10 to 10000,
// empty (the runtime's own) or off, and off only with a memory limit to
// bound the heap; the flag and the environment set it like the others.
func TestValidateGCPercent(t *testing.T) {
	for _, c := range []struct {
		pct, limit string
		ok         bool
	}{
		{"400", "1GiB", true}, {"", "1GiB", true}, {"100", "off", true}, {"off", "1GiB", true},
		{"off", "off", false}, {"off", "", false}, {"0", "1GiB", false}, {"9", "1GiB", false},
		{"10001", "1GiB", false}, {"-1", "1GiB", false}, {"lots", "1GiB", false},
		{"off", "auto", true}, {"400", "auto", true},
	} {
		s := defaultSettings()
		s.GCPercent, s.MemoryLimit = c.pct, c.limit
		got := fields(s.validate())
		if c.ok {
			require.Empty(t, got, "gc_percent %q, memory_limit %q", c.pct, c.limit)
		} else {
			require.Equal(t, []string{"gc_percent"}, got, "gc_percent %q, memory_limit %q", c.pct, c.limit)
		}
	}
	require.Equal(t, defaultGCPercent, defaultSettings().GCPercent)

	clearEnv(t)
	t.Setenv("CGLEDGER_GC_PERCENT", "200")
	s, src, err := loadWith(t)
	require.NoError(t, err)
	require.Equal(t, "200", s.GCPercent)
	require.Equal(t, "env CGLEDGER_GC_PERCENT", src["gc_percent"])
	s, src, err = loadWith(t, "--gc-percent", "off")
	require.NoError(t, err)
	require.Equal(t, "off", s.GCPercent)
	require.Equal(t, "flag --gc-percent", src["gc_percent"])
}

// loadWith runs loadSettings as serve does, over the given flags.
func loadWith(t *testing.T, args ...string) (Settings, map[string]string, error) {
	t.Helper()
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	cfg := configFlags(fs)
	require.NoError(t, fs.Parse(args))
	return loadSettings(fs, *cfg)
}

// clearEnv unsets every CGLEDGER_* variable for the test.
func clearEnv(t *testing.T) {
	t.Helper()
	for _, st := range settings {
		if _, ok := os.LookupEnv(st.env); ok {
			t.Setenv(st.env, "")
			require.NoError(t, os.Unsetenv(st.env))
		}
	}
	if _, ok := os.LookupEnv("CGLEDGER_CONFIG"); ok {
		t.Setenv("CGLEDGER_CONFIG", "")
		require.NoError(t, os.Unsetenv("CGLEDGER_CONFIG"))
	}
}

// TestLoadSettingsPrecedence: defaults, then the config file, then the
// environment, then flags, later ones winning, each value's source named.
func TestLoadSettingsPrecedence(t *testing.T) {
	clearEnv(t)
	cfg := filepath.Join(t.TempDir(), "serve.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("data: /from/file\nhttp_listen: 127.0.0.1:1111\nlog_level: debug\nroles: [api, projector]\nreplicas: 2\n"), 0o600))
	t.Setenv("CGLEDGER_HTTP_LISTEN", "127.0.0.1:2222")
	t.Setenv("CGLEDGER_LOG_LEVEL", "warn")
	t.Setenv("CGLEDGER_SYNC_ALWAYS", "true")

	s, source, err := loadWith(t, "--config", cfg, "--log-level", "error", "--no-auth")
	require.NoError(t, err)
	require.Equal(t, "/from/file", s.Data)
	require.Equal(t, "127.0.0.1:2222", s.HTTPListen)
	require.Equal(t, "error", s.LogLevel)
	require.Equal(t, []string{"api", "projector"}, s.Roles)
	require.Equal(t, 2, s.Replicas)
	require.True(t, s.SyncAlways)
	require.True(t, s.NoAuth)
	require.Equal(t, "text", s.LogFormat)
	require.Equal(t, map[string]string{
		"data":        "file " + cfg,
		"http_listen": "env CGLEDGER_HTTP_LISTEN",
		"log_level":   "flag --log-level",
		"roles":       "file " + cfg,
		"replicas":    "file " + cfg,
		"sync_always": "env CGLEDGER_SYNC_ALWAYS",
		"no_auth":     "flag --no-auth",
		"log_format":  "default",
	}, map[string]string{
		"data": source["data"], "http_listen": source["http_listen"], "log_level": source["log_level"],
		"roles": source["roles"], "replicas": source["replicas"], "sync_always": source["sync_always"],
		"no_auth": source["no_auth"], "log_format": source["log_format"],
	})

	// CGLEDGER_CONFIG names the file when --config does not.
	t.Setenv("CGLEDGER_CONFIG", cfg)
	s, source, err = loadWith(t)
	require.NoError(t, err)
	require.Equal(t, "/from/file", s.Data)
	require.Equal(t, "file "+cfg, source["data"])
}

// TestLoadSettingsListsEveryUnreadableValue: a value that cannot be read,
// from any layer, and an unknown key in the file are each a violation
// naming the setting; the other layers are still read.
func TestLoadSettingsListsEveryUnreadableValue(t *testing.T) {
	clearEnv(t)
	cfg := filepath.Join(t.TempDir(), "serve.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("sync_always: sometimes\ncolour: blue\n"), 0o600))
	t.Setenv("CGLEDGER_NO_AUTH", "maybe")
	s, source, err := loadWith(t, "--config", cfg, "--replicas", "three", "--data", "/from/flag")
	require.Equal(t, []string{"colour", "no_auth", "replicas", "sync_always"}, sortedCopy(violationtest.ConfigFields(t, err)))
	require.Equal(t, "/from/flag", s.Data)
	require.Equal(t, "flag --data", source["data"])
	e, ok := protocol.AsError(err)
	require.True(t, ok)
	for _, v := range e.Violations {
		switch v.Field {
		case "replicas":
			require.Equal(t, `not a valid whole number: got "three" from flag --replicas`, v.Message)
		case "sync_always":
			require.Equal(t, `not a valid boolean (true or false): got "sometimes" from config file `+cfg, v.Message)
		case "no_auth":
			require.Equal(t, `not a valid boolean (true or false): got "maybe" from environment variable CGLEDGER_NO_AUTH`, v.Message)
		}
	}

	// A config file that cannot be read is listed too, and the
	// environment is still read.
	_, _, err = loadWith(t, "--config", filepath.Join(t.TempDir(), "none.yaml"))
	require.Equal(t, []string{"config", "no_auth"}, violationtest.ConfigFields(t, err))
}

func sortedCopy(in []string) []string {
	out := append([]string(nil), in...)
	sort.Strings(out)
	return out
}

// TestGCOffNeedsALimitInForce: the environment's GOGC and GOMEMLIMIT win
// over the settings, so the check of gc_percent off against a memory limit
// looks at what will be in force.
func TestGCOffNeedsALimitInForce(t *testing.T) {
	s := defaultSettings()
	s.GCPercent, s.MemoryLimit = "off", "off"
	t.Setenv("GOMEMLIMIT", "1GiB")
	require.Empty(t, fields(s.validate()), "GOMEMLIMIT gives the limit")

	s.GCPercent, s.MemoryLimit = "400", "off"
	t.Setenv("GOMEMLIMIT", "")
	t.Setenv("GOGC", "off")
	require.Equal(t, []string{"gc_percent"}, fields(s.validate()), "GOGC=off with no limit")

	s.MemoryLimit = "auto"
	t.Setenv("GOMEMLIMIT", "off")
	require.Equal(t, []string{"gc_percent"}, fields(s.validate()), "GOGC=off with GOMEMLIMIT=off")
}

// TestSizesTooLargeAreRefused: a size past what an int64 holds would wrap.
func TestSizesTooLargeAreRefused(t *testing.T) {
	s := defaultSettings()
	s.MemoryLimit, s.DiskReserve = "17179869185GiB", "18446744073709551615"
	require.Equal(t, []string{"disk_reserve", "memory_limit"}, fields(s.validate()))
	s.MemoryLimit, s.DiskReserve = "2TiB", "1TiB"
	require.Empty(t, fields(s.validate()))
}

// TestGOGCTheRuntimeWouldIgnoreIsRefused: the Go runtime silently reads a
// GOGC that is not a whole number or off as 100; serve says so instead.
// A negative GOGC is off to the runtime, so it needs a limit.
func TestGOGCTheRuntimeWouldIgnoreIsRefused(t *testing.T) {
	s := defaultSettings()
	for _, v := range []string{"lots", "4oo", "1e3", " 100"} {
		t.Setenv("GOGC", v)
		vs := s.validate()
		require.Equal(t, []string{"gc_percent"}, fields(vs), "GOGC %q", v)
		require.Contains(t, vs[0].Message, fmt.Sprintf("got %q", v))
	}
	for _, v := range []string{"", "off", "50", "-1"} {
		t.Setenv("GOGC", v)
		require.Empty(t, fields(s.validate()), "GOGC %q", v)
	}
	s.MemoryLimit = "off"
	t.Setenv("GOGC", "-1")
	require.Equal(t, []string{"gc_percent"}, fields(s.validate()), "GOGC=-1 is off, with no limit")
}

// TestConfigFileValuesOfTheWrongShape: a list or a mapping where a single
// value is wanted is refused, naming the setting; a list is read for
// roles; a key with no value reads as empty (for memory_limit and
// gc_percent, a documented value).
func TestConfigFileValuesOfTheWrongShape(t *testing.T) {
	clearEnv(t)
	cfg := filepath.Join(t.TempDir(), "serve.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("memory_limit: [1GiB]\ndisk_reserve: {size: 1GiB}\nroles: [api, projector]\ngc_percent:\n"), 0o600))
	_, _, err := loadWith(t, "--config", cfg)
	require.Equal(t, []string{"disk_reserve", "memory_limit"}, sortedCopy(violationtest.ConfigFields(t, err)))
	e, ok := protocol.AsError(err)
	require.True(t, ok)
	for _, v := range e.Violations {
		require.NotContains(t, v.Message, "<nil>")
		switch v.Field {
		case "memory_limit":
			require.Contains(t, v.Message, "a single value, not a list")
		case "disk_reserve":
			require.Contains(t, v.Message, "a single value, not a mapping")
		}
	}

	require.NoError(t, os.WriteFile(cfg, []byte("memory_limit: 1e9\n"), 0o600))
	s, _, err := loadWith(t, "--config", cfg)
	require.NoError(t, err)
	require.Equal(t, "1000000000", s.MemoryLimit, "a YAML float is written out whole")

	require.NoError(t, os.WriteFile(cfg, []byte("roles: [api, projector]\ngc_percent:\nmemory_limit:\n"), 0o600))
	s, src, err := loadWith(t, "--config", cfg)
	require.NoError(t, err, "loading reads an empty value; validation judges it")
	require.Equal(t, []string{"api", "projector"}, s.Roles)
	require.Empty(t, s.GCPercent)
	require.Equal(t, "file "+cfg, src["gc_percent"])
	require.Empty(t, s.MemoryLimit)
	require.Empty(t, fields(s.validate()), "empty is a documented value of both: no limit, the runtime's own target")
}

// TestSizesAllowSpacesAround: a size read from a file or the environment
// may carry spaces around it, or between the number and its unit.
func TestSizesAllowSpacesAround(t *testing.T) {
	s := defaultSettings()
	for _, v := range []string{" 2GiB", "2GiB ", " 2 GiB ", "2147483648\t"} {
		s.MemoryLimit, s.DiskReserve = v, v
		require.Empty(t, fields(s.validate()), "%q", v)
	}
}

// TestGOMEMLIMITBelowTheFloorIsRefused: GOMEMLIMIT wins over memory_limit,
// so the floor memory_limit keeps (64MiB) holds for it too; off and larger
// limits pass, in the runtime's own spelling.
func TestGOMEMLIMITBelowTheFloorIsRefused(t *testing.T) {
	s := defaultSettings()
	for _, v := range []string{"0", "1000", "1000B", "1MiB", "67108863"} {
		t.Setenv("GOMEMLIMIT", v)
		vs := s.validate()
		require.Equal(t, []string{"memory_limit"}, fields(vs), "GOMEMLIMIT %q", v)
		require.Contains(t, vs[0].Message, "GOMEMLIMIT")
	}
	for _, v := range []string{"", "off", "64MiB", "67108864B", "2GiB"} {
		t.Setenv("GOMEMLIMIT", v)
		require.Empty(t, fields(s.validate()), "GOMEMLIMIT %q", v)
	}
}
