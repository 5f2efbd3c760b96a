package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/cgledger/cgledger/internal/diskspace"
	"github.com/cgledger/cgledger/mcpbridge"
	"github.com/cgledger/cgledger/protocol"
)

// Settings is the effective configuration of `cgledger serve`: defaults,
// then a config file, then CGLEDGER_* environment variables, then flags
// (docs/cli.md, "Configuration").
type Settings struct {
	Data         string `json:"data" yaml:"data"`
	NATSListen   string `json:"nats_listen" yaml:"nats_listen"`
	HTTPListen   string `json:"http_listen" yaml:"http_listen"`
	NATSURL      string `json:"nats_url" yaml:"nats_url"`
	NATSCreds    string `json:"nats_creds" yaml:"nats_creds"`
	NATSUser     string `json:"nats_user" yaml:"nats_user"`
	NATSPassword string `json:"nats_password" yaml:"nats_password"`
	NATSToken    string `json:"nats_token" yaml:"nats_token"`
	Replicas     int    `json:"replicas" yaml:"replicas"`
	SyncAlways   bool   `json:"sync_always" yaml:"sync_always"`
	SyncInterval string `json:"sync_interval" yaml:"sync_interval"`
	AckWait      string `json:"ack_wait" yaml:"ack_wait"`
	// ToolAckWait is the ack wait of the consumers the ledger keeps for
	// tool services (tool.consumer's ack_wait_ms).
	ToolAckWait string `json:"tool_ack_wait" yaml:"tool_ack_wait"`
	// MCPStreamPollAfter ends the SSE stream of an MCP tools/call still
	// waiting this long, for the client to resume it (docs/mcp.md).
	MCPStreamPollAfter string `json:"mcp_stream_poll_after" yaml:"mcp_stream_poll_after"`
	DiskReserve        string `json:"disk_reserve" yaml:"disk_reserve"`
	MemoryLimit        string `json:"memory_limit" yaml:"memory_limit"`
	// GCPercent is the garbage collector's target (runtime/debug.SetGCPercent):
	// empty keeps the Go runtime's own (100, or GOGC), off collects only near
	// MemoryLimit.
	GCPercent   string   `json:"gc_percent" yaml:"gc_percent"`
	LogFormat   string   `json:"log_format" yaml:"log_format"`
	LogLevel    string   `json:"log_level" yaml:"log_level"`
	Roles       []string `json:"roles" yaml:"roles"`
	SourceID    string   `json:"source_id" yaml:"source_id"`
	NoAuth      bool     `json:"no_auth" yaml:"no_auth"`
	TLSCert     string   `json:"tls_cert" yaml:"tls_cert"`
	TLSKey      string   `json:"tls_key" yaml:"tls_key"`
	TLSCA       string   `json:"tls_ca" yaml:"tls_ca"`
	PProf       string   `json:"pprof" yaml:"pprof"`
	Retention   string   `json:"retention" yaml:"retention"`
	ArchiveSeal string   `json:"archive_seal_age" yaml:"archive_seal_age"`
	MCPBridge   string   `json:"mcp_bridge" yaml:"mcp_bridge"`
	// ViewsSnapshotEvery is how often the projector role snapshots its
	// views (docs/views.md#snapshots): a duration of at least 10s, or 0 or
	// off for never; empty is defaultViewsSnapshotEvery.
	ViewsSnapshotEvery string `json:"views_snapshot_every" yaml:"views_snapshot_every"`
	// ViewsSnapshotKeep is how many snapshots pruning keeps, 1 to 1000.
	ViewsSnapshotKeep int `json:"views_snapshot_keep" yaml:"views_snapshot_keep"`
	// ViewsSnapshotDir keeps snapshots in a directory; empty keeps them in
	// the JetStream Object Store bucket of the ledger stream
	// (snapshot.BucketName), which every replica on the cluster reads.
	ViewsSnapshotDir string `json:"views_snapshot_dir" yaml:"views_snapshot_dir"`
	// ViewsRestore restores the newest snapshot that passes its checks when
	// the views are missing, empty or of another views format.
	ViewsRestore bool `json:"views_restore" yaml:"views_restore"`

	// restartInPlace lets serve exec itself to reopen storage that a failed
	// write broke; only the serve command sets it (bench runs serve inside
	// its own process).
	restartInPlace bool
}

// setting describes one setting: its flag, environment variable and how to
// set it from text.
type setting struct {
	key, flag, env, usage string
	set                   func(*Settings, string) error
	get                   func(*Settings) string
	secret                bool
	// list: a config file may give the setting as a YAML list.
	list bool
}

func str(f func(*Settings) *string) (func(*Settings, string) error, func(*Settings) string) {
	return func(s *Settings, v string) error { *f(s) = v; return nil }, func(s *Settings) string { return *f(s) }
}

var settings = func() []setting {
	mk := func(key, flag, usage string, f func(*Settings) *string) setting {
		set, get := str(f)
		return setting{key: key, flag: flag, env: "CGLEDGER_" + strings.ToUpper(key), usage: usage, set: set, get: get}
	}
	list := []setting{
		mk("data", "data", "directory for the embedded JetStream store and the views", func(s *Settings) *string { return &s.Data }),
		mk("nats_listen", "nats-listen", "address the embedded nats-server listens on", func(s *Settings) *string { return &s.NATSListen }),
		mk("http_listen", "http-listen", "address of the HTTP server (/healthz, /readyz, /metrics, /v1/, /projects/)", func(s *Settings) *string { return &s.HTTPListen }),
		mk("nats_url", "nats-url", "use an existing NATS JetStream server or cluster instead of the embedded one", func(s *Settings) *string { return &s.NATSURL }),
		mk("nats_creds", "nats-creds", "NATS credentials file (with --nats-url)", func(s *Settings) *string { return &s.NATSCreds }),
		mk("nats_user", "nats-user", "NATS user (with --nats-url)", func(s *Settings) *string { return &s.NATSUser }),
		mk("sync_interval", "sync-interval", "embedded JetStream fsync interval, e.g. 1s (empty keeps nats-server's 2m)", func(s *Settings) *string { return &s.SyncInterval }),
		mk("ack_wait", "ack-wait", "how long a command waits for its executor's ack (running calls heartbeat every third of it): how soon another executor takes over the calls of one that died; empty means 5s", func(s *Settings) *string { return &s.AckWait }),
		mk("tool_ack_wait", "tool-ack-wait", "ack wait of the consumers the ledger keeps for tool services (tool.consumer's ack_wait_ms): how long a command held by a service that stopped waits before it is delivered again; empty means 30s", func(s *Settings) *string { return &s.ToolAckWait }),
		mk("mcp_stream_poll_after", "mcp-stream-poll-after", "end the SSE stream of an MCP tools/call on /mcp still waiting this long, the client resuming it (SEP-1699 polling) and getting the answer when it comes; empty or off keeps streams open", func(s *Settings) *string { return &s.MCPStreamPollAfter }),
		mk("disk_reserve", "disk-reserve", "free space kept on the data directory's file system: ledger and view writes stop below it (e.g. 64MiB; empty means the smaller of 64MiB and 10% of the file system; off disables the check)", func(s *Settings) *string { return &s.DiskReserve }),
		mk("memory_limit", "memory-limit", "soft limit on the process's Go memory: near it the garbage collector works harder instead of the heap growing (e.g. 4GiB; auto: a quarter of the memory the process may use, its cgroup's limit or the machine's, at least the smaller of 1GiB and half of it; off for none; GOMEMLIMIT in the environment wins)", func(s *Settings) *string { return &s.MemoryLimit }),
		mk("gc_percent", "gc-percent", "garbage collector target: the heap grows this many percent over what it holds before a collection (higher spends less CPU on collecting and more memory, memory_limit still caps it; empty keeps the Go runtime's 100; off collects only near memory_limit; GOGC in the environment wins)", func(s *Settings) *string { return &s.GCPercent }),
		mk("log_format", "log-format", "log format: text or json", func(s *Settings) *string { return &s.LogFormat }),
		mk("log_level", "log-level", "log level: debug, info, warn or error", func(s *Settings) *string { return &s.LogLevel }),
		mk("source_id", "source-id", "author_id of the executor's result cards", func(s *Settings) *string { return &s.SourceID }),
		mk("tls_cert", "tls-cert", "PEM certificate: serve NATS (embedded) and HTTP over TLS; with --nats-url, the client certificate", func(s *Settings) *string { return &s.TLSCert }),
		mk("tls_key", "tls-key", "PEM private key of --tls-cert", func(s *Settings) *string { return &s.TLSKey }),
		mk("pprof", "pprof", "serve net/http/pprof on this address (e.g. 127.0.0.1:6060; off when empty; no authentication: keep it on loopback)", func(s *Settings) *string { return &s.PProf }),
		mk("retention", "retention", "how long the ledger stream keeps entries (e.g. 30d or 720h; empty or 0 keeps everything): older entries live on in sealed segments under <data>/archive, copied before they expire (docs/durability.md)", func(s *Settings) *string { return &s.Retention }),
		mk("archive_seal_age", "archive-seal-age", "with retention, seal an archive segment once its first entry is this old (empty means a tenth of retention, at most 1h); at least 100ms and at most half of retention", func(s *Settings) *string { return &s.ArchiveSeal }),
		mk("mcp_bridge", "mcp-bridge", "MCP bridge configuration file (docs/mcp.md) the mcp role serves", func(s *Settings) *string { return &s.MCPBridge }),
		mk("views_snapshot_every", "views-snapshot-every", "how often the projector role takes a snapshot of its views, which a serve without views restores (docs/views.md#snapshots): a duration of at least 10s such as 1h; 0 or off for never", func(s *Settings) *string { return &s.ViewsSnapshotEvery }),
		mk("views_snapshot_dir", "views-snapshot-dir", "keep view snapshots in this directory instead of the JetStream Object Store bucket cgledger_views_<stream> of the ledger's account", func(s *Settings) *string { return &s.ViewsSnapshotDir }),
		mk("tls_ca", "tls-ca", "PEM CA bundle: verify NATS servers (with --nats-url) and, when serving TLS, require client certificates signed by it", func(s *Settings) *string { return &s.TLSCA }),
	}
	pw := mk("nats_password", "nats-password", "NATS password (with --nats-url; prefer the environment variable)", func(s *Settings) *string { return &s.NATSPassword })
	pw.secret = true
	tok := mk("nats_token", "nats-token", "NATS token (with --nats-url; prefer the environment variable)", func(s *Settings) *string { return &s.NATSToken })
	tok.secret = true
	list = append(list, pw, tok,
		setting{key: "replicas", flag: "replicas", env: "CGLEDGER_REPLICAS", usage: "replicas of the ledger stream and bucket (3 on a cluster)",
			set: func(s *Settings, v string) error {
				n, err := strconv.Atoi(v)
				if err == nil {
					s.Replicas = n
				}
				return err
			}, get: func(s *Settings) string { return strconv.Itoa(s.Replicas) }},
		setting{key: "views_snapshot_keep", flag: "views-snapshot-keep", env: "CGLEDGER_VIEWS_SNAPSHOT_KEEP", usage: "how many view snapshots to keep (older ones are pruned after each snapshot), 1 to 1000",
			set: func(s *Settings, v string) error {
				n, err := strconv.Atoi(v)
				if err == nil {
					s.ViewsSnapshotKeep = n
				}
				return err
			}, get: func(s *Settings) string { return strconv.Itoa(s.ViewsSnapshotKeep) }},
		setting{key: "views_restore", flag: "views-restore", env: "CGLEDGER_VIEWS_RESTORE", usage: "restore the newest view snapshot that passes its checks when the views are missing, empty or of another views format, instead of rebuilding them from the ledger (false to always rebuild)",
			set: func(s *Settings, v string) error {
				b, err := strconv.ParseBool(v)
				if err == nil {
					s.ViewsRestore = b
				}
				return err
			}, get: func(s *Settings) string { return strconv.FormatBool(s.ViewsRestore) }},
		setting{key: "sync_always", flag: "sync-always", env: "CGLEDGER_SYNC_ALWAYS", usage: "fsync every JetStream write before acknowledging it (see docs/durability.md)",
			set: func(s *Settings, v string) error {
				b, err := strconv.ParseBool(v)
				if err == nil {
					s.SyncAlways = b
				}
				return err
			}, get: func(s *Settings) string { return strconv.FormatBool(s.SyncAlways) }},
		setting{key: "no_auth", flag: "no-auth", env: "CGLEDGER_NO_AUTH", usage: "run the embedded NATS and HTTP without authentication (anyone who reaches them can forge, halt or delete the ledger; see docs/security.md)",
			set: func(s *Settings, v string) error {
				b, err := strconv.ParseBool(v)
				if err == nil {
					s.NoAuth = b
				}
				return err
			}, get: func(s *Settings) string { return strconv.FormatBool(s.NoAuth) }},
		setting{key: "roles", flag: "roles", env: "CGLEDGER_ROLES", list: true, usage: "comma-separated roles to run: api, executor, projector, mcp (the MCP bridge of mcp_bridge)",
			set: func(s *Settings, v string) error {
				s.Roles = nil
				for _, r := range strings.Split(v, ",") {
					if r = strings.TrimSpace(r); r != "" {
						s.Roles = append(s.Roles, r)
					}
				}
				return nil
			}, get: func(s *Settings) string { return strings.Join(s.Roles, ",") }},
	)
	return list
}()

// defaultGCPercent is the collector's default target. Measured with
// cgledger bench (docs/performance.md, "CPU cuts (issue 30)"): at Go's 100 the
// collector took about 30% of the CPU of a tool call, the heap the ledger
// holds being small next to what a call allocates; memory_limit bounds the
// memory the larger target lets the heap take.
const defaultGCPercent = "400"

// gcInForce reports whether the collector will be off, and whether a
// memory limit will be set, once the environment's GOGC and GOMEMLIMIT
// (which win over the settings) are taken into account.
func gcInForce(s Settings) (gcOff, limit bool) {
	gcOff = s.GCPercent == "off"
	if v, ok := os.LookupEnv("GOGC"); ok && v != "" {
		// The runtime reads a negative GOGC as off too.
		n, err := strconv.Atoi(v)
		gcOff = v == "off" || (err == nil && n < 0)
	}
	limit = s.MemoryLimit != "" && s.MemoryLimit != "off"
	if v, ok := os.LookupEnv("GOMEMLIMIT"); ok && v != "" {
		limit = v != "off"
	}
	return gcOff, limit
}

// minMemoryLimit is the smallest memory limit serve runs under: below it
// the collector would run without pause.
const minMemoryLimit = 64 << 20

// parseGoMemLimit reads GOMEMLIMIT as the Go runtime does: a byte count
// with an optional unit, B or KiB to TiB. (A malformed one stops the
// runtime before serve starts, so an error here is not reported.)
func parseGoMemLimit(v string) (uint64, error) {
	if n, ok := strings.CutSuffix(v, "B"); ok && !strings.HasSuffix(n, "i") {
		v = n
	}
	return diskspace.ParseSize(v)
}

// validGOGC reports whether the Go runtime reads v as GOGC: empty, off or
// a whole number; it silently ignores anything else.
func validGOGC(v string) bool {
	if v == "" || v == "off" {
		return true
	}
	_, err := strconv.Atoi(v)
	return err == nil
}

// parseGCPercent reads gc_percent: -1 for off, 0 for empty (keep the
// runtime's own), else the percentage.
func parseGCPercent(v string) (int, error) {
	switch v {
	case "":
		return 0, nil
	case "off":
		return -1, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, fmt.Errorf("gc_percent %q: %w", v, err)
	}
	if n < 10 || n > 10000 {
		return 0, fmt.Errorf("gc_percent %d: out of range 10..10000", n)
	}
	return n, nil
}

func defaultSettings() Settings {
	return Settings{Data: "./data", NATSListen: "127.0.0.1:4222", HTTPListen: "127.0.0.1:8080", Replicas: 1, MemoryLimit: memoryLimitAuto, GCPercent: defaultGCPercent,
		LogFormat: "text", LogLevel: "info", Roles: []string{"api", "executor", "projector"}, SourceID: "cgledger.executor",
		ViewsSnapshotEvery: defaultViewsSnapshotEvery, ViewsSnapshotKeep: 3, ViewsRestore: true}
}

// configFlags registers every setting as a flag (with no default: unset
// flags do not override lower layers; loadSettings reads only the flags the
// user set) plus --config.
func configFlags(fs *flag.FlagSet) (configPath *string) {
	configPath = fs.String("config", "", "YAML or JSON config file (env CGLEDGER_CONFIG)")
	def := defaultSettings()
	for _, st := range settings {
		if st.key == "sync_always" || st.key == "no_auth" {
			fs.Bool(st.flag, false, st.usage+" (env "+st.env+")")
			continue
		}
		if st.key == "views_restore" {
			// A boolean flag whose default is true: --views-restore=false
			// turns it off.
			fs.Bool(st.flag, false, st.usage+" (env "+st.env+") (default true)")
			continue
		}
		usage := st.usage + " (env " + st.env + ")"
		if d := st.get(&def); d != "" {
			// The flag's own default stays empty so that an unset flag does
			// not override the file or the environment; help shows the real one.
			usage += " (default " + d + ")"
		}
		fs.String(st.flag, "", usage)
	}
	return configPath
}

// loadSettings layers defaults, file, environment and flags, recording the
// source of each value. A setting that cannot be read is a violation naming
// the setting and where its value came from; every one is listed.
func loadSettings(fs *flag.FlagSet, configPath string) (Settings, map[string]string, error) {
	s := defaultSettings()
	source := map[string]string{}
	for _, st := range settings {
		source[st.key] = "default"
	}
	var vs protocol.Violations
	bad := func(key, from, v string, err error) {
		msg := err.Error()
		var ne *strconv.NumError
		if errors.As(err, &ne) {
			msg = "not a valid " + map[bool]string{true: "boolean (true or false)", false: "whole number"}[ne.Func == "ParseBool"]
		}
		vs.Add(key, protocol.VInvalidValue, "%s: got %q from %s", msg, v, from)
	}
	cfgSource := "--config"
	if configPath == "" {
		configPath, cfgSource = os.Getenv("CGLEDGER_CONFIG"), "CGLEDGER_CONFIG"
	}
	if configPath != "" {
		var m map[string]any
		raw, err := os.ReadFile(configPath)
		if err == nil {
			err = yaml.Unmarshal(raw, &m)
		}
		if err != nil {
			// Listed with every other problem; the environment and the flags
			// are still read.
			vs.Add("config", protocol.VInvalidValue, "file %s (from %s): %v", configPath, cfgSource, err)
			m = nil
		}
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			st := lookupSetting(k)
			if st == nil {
				vs.Add(k, protocol.VInvalidValue, "unknown setting in config file %s (settings: docs/cli.md, Configuration)", configPath)
				continue
			}
			v := m[k]
			text := fmt.Sprint(v)
			switch x := v.(type) {
			case nil:
				// "key:" with nothing after it: no value, as an empty one.
				text = ""
			case float64:
				// YAML reads 1e9 as a float: written out whole, not "1e+09".
				text = strconv.FormatFloat(x, 'f', -1, 64)
			case []any:
				if !st.list {
					vs.Add(k, protocol.VInvalidValue, "must be a single value, not a list, in config file %s", configPath)
					continue
				}
				parts := make([]string, len(x))
				for i, e := range x {
					parts[i] = fmt.Sprint(e)
				}
				text = strings.Join(parts, ",")
			case map[string]any:
				vs.Add(k, protocol.VInvalidValue, "must be a single value, not a mapping, in config file %s", configPath)
				continue
			}
			if err := st.set(&s, text); err != nil {
				bad(k, "config file "+configPath, text, err)
				continue
			}
			source[k] = "file " + configPath
		}
	}
	for _, st := range settings {
		if v, ok := os.LookupEnv(st.env); ok {
			if err := st.set(&s, v); err != nil {
				bad(st.key, "environment variable "+st.env, v, err)
				continue
			}
			source[st.key] = "env " + st.env
		}
	}
	fs.Visit(func(f *flag.Flag) {
		for _, st := range settings {
			if st.flag == f.Name {
				if err := st.set(&s, f.Value.String()); err != nil {
					bad(st.key, "flag --"+f.Name, f.Value.String(), err)
					continue
				}
				source[st.key] = "flag --" + f.Name
			}
		}
	})
	if len(vs) > 0 {
		return s, source, &protocol.Error{Code: protocol.CodeBadRequest, Message: "invalid settings", Violations: vs}
	}
	return s, source, nil
}

func lookupSetting(key string) *setting {
	for i := range settings {
		if settings[i].key == key {
			return &settings[i]
		}
	}
	return nil
}

// validate lists every problem with the settings.
func (s Settings) validate() protocol.Violations {
	var vs protocol.Violations
	if s.NATSURL == "" {
		if s.Data == "" {
			vs.Add("data", protocol.VRequired, "is required with the embedded server")
		}
		if _, _, err := net.SplitHostPort(s.NATSListen); err != nil {
			vs.Add("nats_listen", protocol.VInvalidValue, "must be host:port, got %q", s.NATSListen)
		}
		if s.Replicas > 1 {
			vs.Add("replicas", protocol.VInvalidValue, "the embedded server is a single node: use replicas 1, or --nats-url with a cluster")
		}
	} else {
		u, err := url.Parse(strings.Split(s.NATSURL, ",")[0])
		if err != nil || (u.Scheme != "nats" && u.Scheme != "tls" && u.Scheme != "ws" && u.Scheme != "wss") {
			vs.Add("nats_url", protocol.VInvalidValue, "must be a nats://, tls://, ws:// or wss:// URL (comma-separated for several), got %q", s.NATSURL)
		}
		if s.NATSCreds != "" {
			if _, err := os.Stat(s.NATSCreds); err != nil {
				vs.Add("nats_creds", protocol.VNotFound, "cannot read %s: %v", s.NATSCreds, err)
			}
		}
	}
	if _, _, err := net.SplitHostPort(s.HTTPListen); err != nil {
		vs.Add("http_listen", protocol.VInvalidValue, "must be host:port, got %q", s.HTTPListen)
	}
	if s.Replicas < 1 || s.Replicas > 5 {
		vs.Add("replicas", protocol.VInvalidValue, "must be between 1 and 5, got %d", s.Replicas)
	}
	if s.SyncInterval != "" {
		if d, err := time.ParseDuration(s.SyncInterval); err != nil || d < 0 {
			vs.Add("sync_interval", protocol.VInvalidValue, "must be a duration such as 1s, got %q", s.SyncInterval)
		}
	}
	if s.AckWait != "" {
		if d, err := time.ParseDuration(s.AckWait); err != nil || d < time.Second || d > time.Hour {
			vs.Add("ack_wait", protocol.VInvalidValue, "must be a duration from 1s to 1h such as 5s, got %q", s.AckWait)
		}
	}
	if s.ToolAckWait != "" {
		if d, err := time.ParseDuration(s.ToolAckWait); err != nil || d < time.Second || d > time.Hour {
			vs.Add("tool_ack_wait", protocol.VInvalidValue, "must be a duration from 1s to 1h such as 30s, got %q", s.ToolAckWait)
		}
	}
	if s.MCPStreamPollAfter != "" && s.MCPStreamPollAfter != "off" {
		if d, err := time.ParseDuration(s.MCPStreamPollAfter); err != nil || d < 100*time.Millisecond || d > time.Hour {
			vs.Add("mcp_stream_poll_after", protocol.VInvalidValue, "must be off or a duration from 100ms to 1h such as 25s, got %q", s.MCPStreamPollAfter)
		}
	}
	retention, rerr := parseDays(s.Retention)
	if rerr != nil || retention < 0 || (retention > 0 && retention < time.Second) {
		vs.Add("retention", protocol.VInvalidValue, "must be a duration of at least 1s such as 30d or 720h, or 0 to keep everything, got %q", s.Retention)
	}
	if s.ArchiveSeal != "" {
		d, err := parseDays(s.ArchiveSeal)
		switch {
		case err != nil || d < 100*time.Millisecond:
			vs.Add("archive_seal_age", protocol.VInvalidValue, "must be a duration of at least 100ms such as 1h, got %q", s.ArchiveSeal)
		case rerr == nil && retention > 0 && d > retention/2:
			vs.Add("archive_seal_age", protocol.VInvalidValue, "must be at most half of retention (%s) so that every entry is sealed well before it expires, got %q", retention, s.ArchiveSeal)
		}
	}
	if s.MemoryLimit != "" && s.MemoryLimit != "off" && s.MemoryLimit != memoryLimitAuto {
		switch n, err := diskspace.ParseSize(s.MemoryLimit); {
		case errors.Is(err, diskspace.ErrSizeTooLarge):
			vs.Add("memory_limit", protocol.VInvalidValue, "must be at most %d bytes; got %q", uint64(diskspace.MaxSize), s.MemoryLimit)
		case err != nil:
			vs.Add("memory_limit", protocol.VInvalidValue, "must be a size such as 4GiB (units KiB, MiB, GiB, TiB), auto or off; got %q", s.MemoryLimit)
		case n < minMemoryLimit:
			vs.Add("memory_limit", protocol.VInvalidValue, "must be at least 64MiB; got %q", s.MemoryLimit)
		}
	}
	if v := os.Getenv("GOMEMLIMIT"); v != "" && v != "off" {
		if n, err := parseGoMemLimit(v); err == nil && n < minMemoryLimit {
			vs.Add("memory_limit", protocol.VInvalidValue, "GOMEMLIMIT in the environment (which wins over memory_limit) must be at least 64MiB, or off; got %q", v)
		}
	}
	if _, err := parseGCPercent(s.GCPercent); err != nil {
		vs.Add("gc_percent", protocol.VInvalidValue, "must be a whole number from 10 to 10000 such as 400, off, or empty for the Go runtime's 100; got %q", s.GCPercent)
	} else if v := os.Getenv("GOGC"); !validGOGC(v) {
		vs.Add("gc_percent", protocol.VInvalidValue, "GOGC in the environment (which wins over gc_percent) must be a whole number or off; got %q, which the Go runtime would ignore for its 100", v)
	} else if gcOff, limit := gcInForce(s); gcOff && !limit {
		vs.Add("gc_percent", protocol.VInvalidValue, "off (gc_percent, or GOGC in the environment, which wins) needs a memory limit (memory_limit, or GOMEMLIMIT in the environment, which wins): without one the heap would grow without bound")
	}
	if s.DiskReserve != "" && s.DiskReserve != "off" {
		if _, err := diskspace.ParseSize(s.DiskReserve); errors.Is(err, diskspace.ErrSizeTooLarge) {
			vs.Add("disk_reserve", protocol.VInvalidValue, "must be at most %d bytes; got %q", uint64(diskspace.MaxSize), s.DiskReserve)
		} else if err != nil {
			vs.Add("disk_reserve", protocol.VInvalidValue, "must be a size such as 64MiB (units KiB, MiB, GiB, TiB), or off; got %q", s.DiskReserve)
		}
	}
	if _, err := parseSnapshotEvery(s.ViewsSnapshotEvery); err != nil {
		vs.Add("views_snapshot_every", protocol.VInvalidValue, "must be a duration of at least 10s such as 1h, or 0 or off for never; got %q", s.ViewsSnapshotEvery)
	}
	if s.ViewsSnapshotKeep < 1 || s.ViewsSnapshotKeep > 1000 {
		vs.Add("views_snapshot_keep", protocol.VInvalidValue, "must be between 1 and 1000, got %d", s.ViewsSnapshotKeep)
	}
	if s.ViewsSnapshotDir != "" && s.Data != "" {
		if clash := snapshotDirClash(s.ViewsSnapshotDir, s.Data); clash != "" {
			vs.Add("views_snapshot_dir", protocol.VInvalidValue, "must not be the data directory, nor inside a directory serve removes or replaces there (views, views.restoring, views.replaced, snapshots.tmp, jetstream): it is %s; got %q", clash, s.ViewsSnapshotDir)
		}
	}
	if s.LogFormat != "text" && s.LogFormat != "json" {
		vs.Add("log_format", protocol.VInvalidValue, "must be text or json, got %q", s.LogFormat)
	}
	switch s.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		vs.Add("log_level", protocol.VInvalidValue, "must be debug, info, warn or error, got %q", s.LogLevel)
	}
	if len(s.Roles) == 0 {
		vs.Add("roles", protocol.VRequired, "at least one of api, executor, projector")
	}
	for _, r := range s.Roles {
		if r != "api" && r != "executor" && r != "projector" && r != "mcp" {
			vs.Add("roles", protocol.VInvalidValue, "unknown role %q (api, executor, projector, mcp)", r)
		}
	}
	switch {
	case s.has("mcp") && s.MCPBridge == "":
		vs.Add("mcp_bridge", protocol.VRequired, "the mcp role needs the MCP bridge configuration file (docs/mcp.md)")
	case s.has("mcp"):
		if _, err := mcpbridge.LoadConfig(s.MCPBridge); err != nil {
			if e, ok := protocol.AsError(err); ok {
				for _, v := range e.Violations {
					vs.Add("mcp_bridge."+v.Field, v.Code, "%s", v.Message)
				}
			} else {
				vs.Add("mcp_bridge", protocol.VNotFound, "%v", err)
			}
		}
	case s.MCPBridge != "":
		vs.Add("mcp_bridge", protocol.VInvalidValue, "is set but the mcp role is not")
	}
	if s.PProf != "" {
		if _, _, err := net.SplitHostPort(s.PProf); err != nil {
			vs.Add("pprof", protocol.VInvalidValue, "must be host:port, got %q", s.PProf)
		}
	}
	if (s.TLSCert == "") != (s.TLSKey == "") {
		vs.Add("tls_cert", protocol.VInvalidValue, "tls_cert and tls_key go together")
	}
	for key, path := range map[string]string{"tls_cert": s.TLSCert, "tls_key": s.TLSKey, "tls_ca": s.TLSCA} {
		if path != "" {
			if _, err := os.Stat(path); err != nil {
				vs.Add(key, protocol.VNotFound, "cannot read %s: %v", path, err)
			}
		}
	}
	if !protocol.ValidName(s.SourceID) {
		vs.Add("source_id", protocol.VInvalidValue, "must be a name without whitespace, got %q", s.SourceID)
	}
	return vs
}

func (s Settings) has(role string) bool {
	for _, r := range s.Roles {
		if r == role {
			return true
		}
	}
	return false
}

// checkConfig implements `cgledger check-config`.
func checkConfig(args []string) int {
	fs := newFlagSet("check-config", "check-config [--config FILE] [serve flags...]",
		"Validate the serve configuration (file, CGLEDGER_* environment, flags) and print the effective settings with where each came from. Secrets are masked. Exit 0 when valid, 2 when not.")
	cfgPath := configFlags(fs)
	if _, code, ok := parseOrExit(fs, args, 0); !ok {
		return code
	}
	s, source, err := loadSettings(fs, *cfgPath)
	var vs protocol.Violations
	if e, ok := protocol.AsError(err); ok {
		vs = append(vs, e.Violations...)
	} else if err != nil {
		return failf(exitUsage, "check-config: %v", err)
	}
	type item struct {
		Value  string `json:"value"`
		Source string `json:"source"`
	}
	out := map[string]item{}
	for _, st := range settings {
		v := st.get(&s)
		if st.secret && v != "" {
			v = "********"
		}
		out[st.key] = item{Value: v, Source: source[st.key]}
	}
	vs = append(vs, s.validate()...)
	body := map[string]any{"valid": len(vs) == 0, "settings": out}
	if len(vs) > 0 {
		body["violations"] = vs
	}
	b, _ := json.MarshalIndent(body, "", "  ")
	fmt.Fprintln(stdout, string(b))
	if len(vs) > 0 {
		return exitUsage
	}
	return exitOK
}

// parseDays reads a duration as time.ParseDuration does, and also whole
// days ("30d"), the unit retention is usually given in. Empty is 0.
func parseDays(v string) (time.Duration, error) {
	if v == "" {
		return 0, nil
	}
	if n, ok := strings.CutSuffix(v, "d"); ok {
		d, err := strconv.ParseUint(n, 10, 32)
		if err != nil {
			return 0, fmt.Errorf("bad number of days %q", v)
		}
		return time.Duration(d) * 24 * time.Hour, nil
	}
	return time.ParseDuration(v)
}
