package projector

import (
	"context"
	"fmt"

	"github.com/cgledger/cgledger/protocol"
)

// viewsSnapshot answers a views.snapshot request (an admin's: NATS
// permissions refuse it to everyone else) with the manifest of the
// snapshot APIConfig.Snapshot takes.
func (s *APIServer) viewsSnapshot(ctx context.Context, body []byte) (protocol.ViewsSnapshotResult, error) {
	if err := protocol.BadRequest("views.snapshot request", protocol.ParseViewsSnapshotRequest(body)); err != nil {
		return protocol.ViewsSnapshotResult{}, err
	}
	if s.cfg.Snapshot == nil {
		return protocol.ViewsSnapshotResult{}, &protocol.Error{Code: protocol.CodeInternal, Message: "views.snapshot: this serve process takes no snapshots"}
	}
	res, err := s.cfg.Snapshot(ctx)
	if err != nil {
		if _, ok := protocol.AsError(err); ok {
			return res, err
		}
		return res, &protocol.Error{Code: protocol.CodeInternal, Message: fmt.Sprintf("views.snapshot: %v", err)}
	}
	return res, nil
}

// viewsSnapshotList answers a views.snapshot.list request (an admin's)
// with what APIConfig.SnapshotList lists.
func (s *APIServer) viewsSnapshotList(ctx context.Context, body []byte) (protocol.ViewsSnapshotListResult, error) {
	if err := protocol.BadRequest("views.snapshot.list request", protocol.ParseViewsSnapshotRequest(body)); err != nil {
		return protocol.ViewsSnapshotListResult{}, err
	}
	if s.cfg.SnapshotList == nil {
		return protocol.ViewsSnapshotListResult{}, &protocol.Error{Code: protocol.CodeInternal, Message: "views.snapshot.list: this serve process takes no snapshots"}
	}
	res, err := s.cfg.SnapshotList(ctx)
	if err != nil {
		if _, ok := protocol.AsError(err); ok {
			return res, err
		}
		return res, &protocol.Error{Code: protocol.CodeInternal, Message: fmt.Sprintf("views.snapshot.list: %v", err)}
	}
	return res, nil
}
