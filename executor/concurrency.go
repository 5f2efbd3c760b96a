package executor

import (
	"github.com/cgledger/cgledger/protocol"
)

func (e *Executor) sem(project string, def *protocol.ToolDefinition) chan struct{} {
	n := def.Limits.ConcurrencyMax
	if n <= 0 {
		n = protocol.DefaultConcurrencyMax
	}
	// One semaphore per tool of a project, replaced when its limit changes
	// (calls holding the old one release into it): re-registrations do not
	// pile up semaphores.
	key := project + "\x00" + def.ToolName
	e.mu.Lock()
	defer e.mu.Unlock()
	s, ok := e.sems[key]
	if !ok || s.n != n {
		s = toolSem{n: n, c: make(chan struct{}, n)}
		e.sems[key] = s
	}
	return s.c
}

// toolSem is a tool's concurrency limit and its semaphore.
type toolSem struct {
	n int
	c chan struct{}
}
