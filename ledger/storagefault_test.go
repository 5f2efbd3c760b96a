package ledger_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/cgledger/cgledger/internal/natsserver"
	"github.com/cgledger/cgledger/internal/natstest"
	"github.com/cgledger/cgledger/ledger"
	"github.com/cgledger/cgledger/ledger/ledgertest"
	"github.com/cgledger/cgledger/protocol"
)

// TestStorageFaultFollowsTheServersRefusals fills a server whose storage
// limit is small: once it refuses a write for want of storage, the ledger
// says so (serve's readiness reads it), naming the server's error; writes
// refused as bad requests never set it.
func TestStorageFaultFollowsTheServersRefusals(t *testing.T) {
	srv := natstest.Start(t, func(c *natsserver.Config) { c.MaxStore = 512 << 10 })
	ctx := ledgertest.Ctx(t)
	l, err := ledger.Open(ctx, srv.Connect(t), ledger.Config{Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	defer l.Close()

	c := ledgertest.Call{Project: "demo", Channel: "main", Agent: "alice", Turn: "t1", Epoch: 1, Tool: "echo"}
	bad := c.ResultCard(protocol.StatusSuccess, `{}`)
	bad.CardID = ""
	_, err = l.PutCard(ctx, bad)
	require.Error(t, err)
	require.NoError(t, l.StorageFault(), "a refused request is not a storage fault")

	big := `"` + strings.Repeat("x", 32<<10) + `"`
	err = nil
	for i := 0; i < 64 && err == nil; i++ {
		c.ID = "c" + strconv.Itoa(i)
		_, err = l.PutCard(ctx, c.ResultCard(protocol.StatusSuccess, big))
		if err == nil {
			require.NoError(t, l.StorageFault(), "a write went through")
		}
	}
	require.Error(t, err, "the server's storage limit is met")
	fault := l.StorageFault()
	require.ErrorIs(t, fault, ledger.ErrStorageRefused)
	require.Contains(t, fault.Error(), "insufficient resources")
}
