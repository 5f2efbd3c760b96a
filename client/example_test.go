package client_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/nats-io/nats.go"

	"github.com/cgledger/cgledger/client"
	"github.com/cgledger/cgledger/internal/natsserver"
	"github.com/cgledger/cgledger/ledger"
	"github.com/cgledger/cgledger/protocol"
)

// embedded starts a throwaway JetStream server and connects to it; the
// returned function stops both.
func embedded() (*nats.Conn, func()) {
	dir, err := os.MkdirTemp("", "cgledger-example-")
	if err != nil {
		log.Fatal(err)
	}
	srv, err := natsserver.Start(natsserver.Config{StoreDir: dir})
	if err != nil {
		log.Fatal(err)
	}
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		log.Fatal(err)
	}
	return nc, func() {
		nc.Close()
		srv.Shutdown()
		srv.WaitForShutdown()
		_ = os.RemoveAll(dir)
	}
}

// A client in another process speaks the request/reply API that ServeAPI
// answers (docs/protocol.md): here an agent records its worker target and
// reads it back; a refused request carries the protocol code and every
// violation.
func ExampleNew() {
	nc, stop := embedded()
	defer stop()
	ctx := context.Background()
	l, err := ledger.Open(ctx, nc, ledger.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	api, err := l.ServeAPI(ctx, ledger.APIConfig{})
	if err != nil {
		log.Fatal(err)
	}
	defer api.Stop()

	c := client.New(nc, client.WithActor("alice"))
	if _, err := c.SetRoster(ctx, protocol.RosterEntry{ProjectID: "demo", AgentID: "alice", WorkerTarget: "worker-7"}); err != nil {
		log.Fatal(err)
	}
	r, err := c.GetRoster(ctx, "demo", "alice")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("worker target:", r.WorkerTarget)

	_, err = c.SetRoster(ctx, protocol.RosterEntry{ProjectID: "demo", AgentID: "alice", WorkerTarget: "no spaces allowed"})
	if le, ok := protocol.AsError(err); ok {
		fmt.Println(le.Code)
		for _, v := range le.Violations {
			fmt.Println("-", v.Field, v.Code)
		}
	}
	// Output:
	// worker target: worker-7
	// bad_request
	// - body.worker_target invalid_token
}
