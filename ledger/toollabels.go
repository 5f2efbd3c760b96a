package ledger

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cgledger/cgledger/internal/toollabels"
	"github.com/cgledger/cgledger/protocol"
)

// newBuiltinLabels returns the tool labels knowing the PMO built-ins as built-ins.
func newBuiltinLabels() *toollabels.Labels {
	t := toollabels.New()
	t.AddBuiltin(protocol.ReservedToolNames...)
	return t
}

// callToolLabel is the tool label of every ledger metric about call rec
// (toollabels.Labels.CallLabel): its name when the call pinned a definition
// registered in its own project at dispatch or the name is built in, else
// toollabels.Other.
func (l *Ledger) callToolLabel(rec *protocol.CallRecord) string {
	return l.labels.CallLabel(rec.ToolName, rec.ToolDefSeq != 0)
}

// ToolLabels is the ledger's: it knows the PMO built-ins, every tool
// registered in any project when the ledger opened, and every registration
// this process has made or seen since (the cache watch sees every ledger's
// tool entries). A process that embeds an executor shares it with the
// executor, which adds its built-ins (executor.New).
func (l *Ledger) ToolLabels() *toollabels.Labels { return l.labels }

// registeredToolNames lists every tool name registered in any project.
func registeredToolNames(ctx context.Context, s jetstream.Stream, version string) ([]string, error) {
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(protocol.ToolEntriesFilter(version)))
	if err != nil {
		return nil, fmt.Errorf("list registered tool names: %w", err)
	}
	names := make([]string, 0, len(info.State.Subjects))
	for subj := range info.State.Subjects {
		names = append(names, protocol.ToolEntryName(subj))
	}
	return names, nil
}
