package snapshot

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// ObjectStore is a Target keeping snapshots in a JetStream Object Store
// bucket, so every replica on the cluster reads them: one object per
// snapshot, named as the snapshot, with its manifest as JSON in the
// object's metadata (metadataKey). An upload cut short leaves chunks that
// no object names; PurgeOrphans (run by Prune) removes them.
type ObjectStore struct {
	bucket string
	js     jetstream.JetStream
	obs    jetstream.ObjectStore
	// orphanAfter is how long chunks without an object are left alone: an
	// upload from another replica may still be sending them.
	orphanAfter time.Duration
	// chunkSize is the object store's chunk size; 0 is its default
	// (128 KiB). Tests make it small so a killed upload leaves chunks.
	chunkSize uint32
}

// metadataKey is the object metadata entry holding the manifest.
const metadataKey = "cgledger-manifest"

// objectOrphanAfter is ObjectStore's default orphanAfter.
const objectOrphanAfter = time.Hour

// BucketName is the default bucket for a ledger stream's snapshots.
func BucketName(stream string) string { return "cgledger_views_" + stream }

// NewObjectStore opens the bucket, creating it (file storage, replicas
// copies, as the ledger stream's) when it does not exist.
func NewObjectStore(ctx context.Context, js jetstream.JetStream, bucket string, replicas int) (*ObjectStore, error) {
	if js == nil || bucket == "" {
		return nil, errors.New("snapshot: object store target: a JetStream context and a bucket are required")
	}
	obs, err := js.ObjectStore(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		obs, err = js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{
			Bucket: bucket, Description: "cgledger views snapshots", Storage: jetstream.FileStorage, Replicas: max(replicas, 1),
		})
	}
	if err != nil {
		return nil, fmt.Errorf("snapshot: object store %s: %w", bucket, err)
	}
	return &ObjectStore{bucket: bucket, js: js, obs: obs, orphanAfter: objectOrphanAfter}, nil
}

// Put implements Target. The object store publishes the object's metadata
// after its last chunk, so a Put cut short is not listed.
func (o *ObjectStore) Put(ctx context.Context, m Manifest, body io.Reader) error {
	if err := checkName(m.Name); err != nil {
		return err
	}
	raw, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("snapshot: put %s: %w", m.Name, err)
	}
	cr := &countingReader{r: body}
	meta := jetstream.ObjectMeta{Name: m.Name, Metadata: map[string]string{metadataKey: string(raw)}}
	if o.chunkSize > 0 {
		meta.Opts = &jetstream.ObjectMetaOptions{ChunkSize: o.chunkSize}
	}
	info, err := o.obs.Put(ctx, meta, cr)
	if err != nil {
		return fmt.Errorf("snapshot: put %s to %s: %w", m.Name, o, err)
	}
	if int64(info.Size) != m.Size {
		_ = o.obs.Delete(context.WithoutCancel(ctx), m.Name)
		return fmt.Errorf("snapshot: put %s to %s: %d bytes stored, the manifest says %d", m.Name, o, info.Size, m.Size)
	}
	return nil
}

// List implements Target. Objects that are not snapshots (no or another
// manifest) are not listed.
func (o *ObjectStore) List(ctx context.Context) ([]Manifest, error) {
	infos, err := o.obs.List(ctx)
	if errors.Is(err, jetstream.ErrNoObjectsFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("snapshot: list %s: %w", o, err)
	}
	var ms []Manifest
	for _, info := range infos {
		if m, ok := manifestOf(info); ok {
			ms = append(ms, m)
		}
	}
	sortNewestFirst(ms)
	return ms, nil
}

// manifestOf reads the manifest in an object's metadata.
func manifestOf(info *jetstream.ObjectInfo) (Manifest, bool) {
	if info == nil || info.Deleted {
		return Manifest{}, false
	}
	var m Manifest
	if json.Unmarshal([]byte(info.Metadata[metadataKey]), &m) != nil || m.Name != info.Name || checkName(m.Name) != nil || int64(info.Size) != m.Size {
		return Manifest{}, false
	}
	return m, true
}

// Open implements Target. The object store checks the object's own digest
// as the last chunk is read: a body changed in the bucket fails the read.
func (o *ObjectStore) Open(ctx context.Context, name string) (io.ReadCloser, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	r, err := o.obs.Get(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("snapshot: open %s in %s: %w", name, o, err)
	}
	return r, nil
}

// Delete implements Target.
func (o *ObjectStore) Delete(ctx context.Context, name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	if err := o.obs.Delete(ctx, name); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
		return fmt.Errorf("snapshot: delete %s from %s: %w", name, o, err)
	}
	return nil
}

// PurgeOrphans purges the chunk subjects no object's metadata names (what
// an upload killed part way leaves), once their newest chunk is an hour
// old: a younger one may be an upload still running on another replica. It
// returns the subjects purged.
func (o *ObjectStore) PurgeOrphans(ctx context.Context) ([]string, error) {
	s, err := o.js.Stream(ctx, "OBJ_"+o.bucket)
	if err != nil {
		return nil, fmt.Errorf("snapshot: purge %s: %w", o, err)
	}
	chunkPrefix := "$O." + o.bucket + ".C."
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(chunkPrefix+">"))
	if err != nil {
		return nil, fmt.Errorf("snapshot: purge %s: %w", o, err)
	}
	used := map[string]bool{}
	infos, err := o.obs.List(ctx, jetstream.ListObjectsShowDeleted())
	if err != nil && !errors.Is(err, jetstream.ErrNoObjectsFound) {
		return nil, fmt.Errorf("snapshot: purge %s: %w", o, err)
	}
	for _, oi := range infos {
		if !oi.Deleted {
			used[oi.NUID] = true
		}
	}
	var purged []string
	for subj := range info.State.Subjects {
		nuid, ok := strings.CutPrefix(subj, chunkPrefix)
		if !ok || used[nuid] {
			continue
		}
		last, err := s.GetLastMsgForSubject(ctx, subj)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return purged, fmt.Errorf("snapshot: purge %s: %w", o, err)
		}
		if time.Since(last.Time) < o.orphanAfter {
			continue
		}
		if err := s.Purge(ctx, jetstream.WithPurgeSubject(subj)); err != nil {
			return purged, fmt.Errorf("snapshot: purge %s: %w", o, err)
		}
		purged = append(purged, subj)
	}
	return purged, nil
}

// String implements Target.
func (o *ObjectStore) String() string { return "object store " + o.bucket }
