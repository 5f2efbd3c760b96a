package projector

import "github.com/cgledger/cgledger/internal/lru"

// maxCachedStates bounds the call-state cache: the calls a report, wakeup or
// consumption is likely to follow soon are the recent ones.
const maxCachedStates = 32768

// newStateCache keeps the newest committed state of recently used calls, so
// that applying a report or a wakeup does not seek the database and memory
// does not grow with history. A cached nil means the call has no state (as
// of the commits seen).
func newStateCache(max int) *lru.Cache[*CallState] { return lru.New[*CallState](max) }
