package stream

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cgledger/cgledger/protocol"
	"github.com/nats-io/nats.go/jetstream"
)

// Config is the one place the ledger's JetStream resources are
// described. Zero values mean the documented defaults.
type Config struct {
	// Stream is the ledger stream name. Empty means "CG_LEDGER".
	Stream string
	// Bucket is the KV bucket holding call records and report dedup claims.
	// Empty means "CG_CALLS".
	Bucket string
	// Replicas for the stream and the bucket. Zero means 1 (embedded server);
	// use 3 on a cluster.
	Replicas int
	// DuplicateWindow is JetStream's Nats-Msg-Id dedup window. Zero means 2
	// minutes. The ledger does not rely on it for exactly-once (see
	// docs/report-path.md); it only absorbs fast client retries.
	DuplicateWindow time.Duration
	// MaxMsgSize caps one entry (card, command, report) in bytes. Zero means
	// 1 MiB.
	MaxMsgSize int32
	// MaxBytes caps the ledger stream. Zero means unlimited. When full, new
	// writes are refused (DiscardNew); history is never dropped to make room.
	MaxBytes int64
	// MaxAge is the explicit retention policy of the ledger stream. Zero means
	// keep every entry forever.
	MaxAge time.Duration
	// CallRecordTTL bounds how long call records stay in the bucket. Zero
	// means forever. A report arriving after its record expired is rejected
	// as unknown_call, so set it well above the longest tool deadline.
	CallRecordTTL time.Duration
	// ManagedRetention says that the bucket's max age and the duplicate
	// windows are set by ApplyRetention (the stream's entries expire by the
	// TTL ledger.Config.Retention gives them), not by Provision: Provision then
	// creates streams without a max age and leaves an existing stream's max
	// age and duplicate window as they are.
	// False (the zero value) means MaxAge and CallRecordTTL are checked as
	// given. serve sets it (docs/durability.md, "History beyond one stream").
	ManagedRetention bool
}

// Defaults for Config.
const (
	DefaultName            = "CG_LEDGER"
	DefaultBucket          = "CG_CALLS"
	DefaultDuplicateWindow = 2 * time.Minute
	DefaultMaxMsgSize      = 1 << 20
)

// WithDefaults is c with its zero values replaced by the defaults.
func (c Config) WithDefaults() Config {
	if c.Stream == "" {
		c.Stream = DefaultName
	}
	if c.Bucket == "" {
		c.Bucket = DefaultBucket
	}
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.DuplicateWindow == 0 {
		c.DuplicateWindow = DefaultDuplicateWindow
	}
	if c.MaxMsgSize == 0 {
		c.MaxMsgSize = DefaultMaxMsgSize
	}
	if c.MaxBytes == 0 {
		c.MaxBytes = -1
	}
	return c
}

// ErrIncompatibleConfig is returned when a stream or bucket already exists
// with settings the ledger would have to change. The ledger never changes an
// existing stream silently.
var ErrIncompatibleConfig = errors.New("incompatible existing JetStream config")

// ledgerStreamConfig is the ledger stream's full configuration. Direct gets
// are allowed only on a single replica: on a cluster a direct get may be served
// by a lagging follower, which would break read-your-writes for cards.
func (c Config) ledgerStreamConfig() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:              c.Stream,
		Description:       "cgledger: append-only ledger of tool commands, cards, reports, wakeups and rejections",
		Subjects:          []string{protocol.AllSubjectsFilter},
		Retention:         jetstream.LimitsPolicy,
		Storage:           jetstream.FileStorage,
		Replicas:          c.Replicas,
		Duplicates:        c.DuplicateWindow,
		MaxMsgSize:        c.MaxMsgSize,
		MaxBytes:          c.MaxBytes,
		MaxAge:            c.MaxAge,
		MaxMsgs:           -1,
		MaxConsumers:      -1,
		MaxMsgsPerSubject: -1,
		Discard:           jetstream.DiscardNew,
		DenyDelete:        true,
		DenyPurge:         true,
		AllowDirect:       c.Replicas == 1,
		// Entries expire by their own TTL under a retention window (ttl.go).
		// Only the ledger writes to the stream, so no one else can give an
		// entry a shorter life.
		AllowMsgTTL: true,
		// report.result stores a result card and its report together, as
		// one atomic batch (ledger/result.go).
		AllowAtomicPublish: true,
	}
}

// bucketStreamConfig is the KV bucket's backing stream, written out rather
// than via CreateKeyValue so that direct gets follow the same rule as above.
func (c Config) bucketStreamConfig() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:              "KV_" + c.Bucket,
		Description:       "cgledger: call records and report dedup claims keyed by (project, agent_turn_id, tool_call_id)",
		Subjects:          []string{"$KV." + c.Bucket + ".>"},
		Retention:         jetstream.LimitsPolicy,
		Storage:           jetstream.FileStorage,
		Replicas:          c.Replicas,
		Duplicates:        c.DuplicateWindow,
		MaxMsgSize:        c.MaxMsgSize,
		MaxBytes:          -1,
		MaxAge:            c.CallRecordTTL,
		MaxMsgs:           -1,
		MaxConsumers:      -1,
		MaxMsgsPerSubject: 1,
		Discard:           jetstream.DiscardNew,
		AllowRollup:       true,
		DenyDelete:        true,
		AllowDirect:       c.Replicas == 1,
	}
}

// Provision creates the ledger stream and the KV bucket, or checks that
// existing ones match. Running it twice changes nothing; an existing stream
// whose settings differ is reported with ErrIncompatibleConfig naming every
// differing field.
func Provision(ctx context.Context, js jetstream.JetStream, cfg Config) error {
	cfg = cfg.WithDefaults()
	if cfg.ManagedRetention {
		cfg.MaxAge, cfg.CallRecordTTL = 0, 0
	}
	if err := ensureStream(ctx, js, cfg.ledgerStreamConfig(), cfg.ManagedRetention); err != nil {
		return err
	}
	if err := enableAtomicPublish(ctx, js, cfg.Stream); err != nil {
		return err
	}
	return ensureStream(ctx, js, cfg.bucketStreamConfig(), cfg.ManagedRetention)
}

// ApplyRetention sets the call-record bucket's TTL to window (zero keeps
// records forever) and keeps the duplicate windows of the bucket and the
// ledger stream within it. The ledger stream itself gets no max age: its
// entries expire by their own TTL (ledger.Config.Retention), so that tool
// definitions and roster entries can be kept; a max age left by an earlier
// build is removed. It is for a ledger provisioned with ManagedRetention.
func ApplyRetention(ctx context.Context, js jetstream.JetStream, cfg Config, window time.Duration) error {
	cfg = cfg.WithDefaults()
	dup := cfg.DuplicateWindow
	if window > 0 && dup > window {
		dup = window
	}
	for _, st := range []struct {
		name   string
		maxAge time.Duration
	}{{cfg.Stream, 0}, {"KV_" + cfg.Bucket, window}} {
		s, err := js.Stream(ctx, st.name)
		if err != nil {
			return fmt.Errorf("apply retention: look up stream %s: %w", st.name, err)
		}
		sc := s.CachedInfo().Config
		if sc.MaxAge == st.maxAge && sc.Duplicates == dup {
			continue
		}
		sc.MaxAge, sc.Duplicates = st.maxAge, dup
		if _, err := js.UpdateStream(ctx, sc); err != nil {
			return fmt.Errorf("apply retention %s to stream %s: %w", window, st.name, err)
		}
	}
	return nil
}

func ensureStream(ctx context.Context, js jetstream.JetStream, want jetstream.StreamConfig, managed bool) error {
	s, err := js.Stream(ctx, want.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		_, err = js.CreateStream(ctx, want)
		if err == nil {
			return nil
		}
		if !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return fmt.Errorf("provision: create stream %s: %w", want.Name, err)
		}
		// Another process created it first; check what it created.
		s, err = js.Stream(ctx, want.Name)
	}
	if err != nil {
		return fmt.Errorf("provision: look up stream %s: %w", want.Name, err)
	}
	if managed {
		have := s.CachedInfo().Config
		want.MaxAge, want.Duplicates = have.MaxAge, have.Duplicates
	}
	if diffs := diffStreamConfig(want, s.CachedInfo().Config); len(diffs) > 0 {
		return &IncompatibleConfigError{Stream: want.Name, Diffs: diffs}
	}
	return nil
}

// IncompatibleConfigError lists every setting of an existing stream that
// differs from what the ledger needs.
type IncompatibleConfigError struct {
	Stream string
	Diffs  []string
}

// Error implements error.
func (e *IncompatibleConfigError) Error() string {
	return fmt.Sprintf("provision: stream %s exists with a different config (%v); change it deliberately or point the ledger at another stream", e.Stream, e.Diffs)
}

// Unwrap matches ErrIncompatibleConfig.
func (e *IncompatibleConfigError) Unwrap() error { return ErrIncompatibleConfig }

func diffStreamConfig(want, got jetstream.StreamConfig) []string {
	var d []string
	check := func(name string, w, g any) {
		if fmt.Sprint(w) != fmt.Sprint(g) {
			d = append(d, fmt.Sprintf("%s: want %v, have %v", name, w, g))
		}
	}
	check("subjects", want.Subjects, got.Subjects)
	check("retention", want.Retention, got.Retention)
	check("storage", want.Storage, got.Storage)
	check("replicas", want.Replicas, got.Replicas)
	check("duplicate_window", want.Duplicates, got.Duplicates)
	check("max_msg_size", want.MaxMsgSize, got.MaxMsgSize)
	check("max_bytes", want.MaxBytes, got.MaxBytes)
	check("max_age", want.MaxAge, got.MaxAge)
	check("max_msgs_per_subject", want.MaxMsgsPerSubject, got.MaxMsgsPerSubject)
	check("discard", want.Discard, got.Discard)
	check("deny_delete", want.DenyDelete, got.DenyDelete)
	check("deny_purge", want.DenyPurge, got.DenyPurge)
	check("allow_rollup", want.AllowRollup, got.AllowRollup)
	check("allow_direct", want.AllowDirect, got.AllowDirect)
	return d
}

// enableAtomicPublish turns on atomic batch publish on a ledger stream
// created before report.result used it, in place: it changes nothing stored
// and no other setting.
func enableAtomicPublish(ctx context.Context, js jetstream.JetStream, name string) error {
	s, err := js.Stream(ctx, name)
	if err != nil {
		return fmt.Errorf("provision: look up stream %s: %w", name, err)
	}
	sc := s.CachedInfo().Config
	if sc.AllowAtomicPublish {
		return nil
	}
	sc.AllowAtomicPublish = true
	if _, err := js.UpdateStream(ctx, sc); err != nil {
		return fmt.Errorf("provision: turn on atomic batch publish on stream %s (nats-server 2.12 or later): %w", name, err)
	}
	return nil
}
