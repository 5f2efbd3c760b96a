package natstest

import (
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// Cluster is a JetStream cluster of embedded servers in this process, routed
// to each other on loopback, each with its own file store in a temporary
// directory. It is the in-process counterpart of a production R3 cluster:
// replicated streams, a stream leader elected by Raft, proposals in flight.
// Nodes can be stopped and started again on the same store and ports.
type Cluster struct {
	tb    testing.TB
	nodes []*Node
}

// Node is one server of a Cluster.
type Node struct {
	name        string
	store       string
	port        int
	clusterPort int
	routes      []string

	mu  sync.Mutex
	srv *server.Server
}

// StartCluster starts a size-node cluster and waits until its meta leader
// sees every node current, so a replicated stream can be placed at once.
// Every node is shut down by tb.Cleanup.
func StartCluster(tb testing.TB, size int) *Cluster {
	tb.Helper()
	c := NewCluster(tb, size)
	for i := range c.nodes {
		c.Start(tb, i)
	}
	c.WaitFormed(tb)
	return c
}

// NewCluster lays out a size-node cluster (names, stores, ports, routes)
// without starting any node: a test starts them with Start, for instance
// one alone to have a cluster without quorum.
func NewCluster(tb testing.TB, size int) *Cluster {
	tb.Helper()
	c := &Cluster{tb: tb}
	for i := range size {
		c.nodes = append(c.nodes, &Node{name: fmt.Sprintf("n%d", i+1), store: tb.TempDir(), port: freePort(tb), clusterPort: freePort(tb)})
	}
	for _, n := range c.nodes {
		for _, o := range c.nodes {
			if o != n {
				n.routes = append(n.routes, fmt.Sprintf("nats://127.0.0.1:%d", o.clusterPort))
			}
		}
	}
	tb.Cleanup(func() {
		for _, n := range c.nodes {
			n.Shutdown()
		}
	})
	return c
}

// freePort reserves a loopback port for a node: routes name every node's
// cluster port before any node starts, and a restarted node keeps its ports.
func freePort(tb testing.TB) int {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("natstest: reserve a port: %v", err)
		return 0
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// Size is the number of nodes.
func (c *Cluster) Size() int { return len(c.nodes) }

// Node returns node i (from 0).
func (c *Cluster) Node(i int) *Node { return c.nodes[i] }

// URLs is every node's client URL, comma-separated, as serve's --nats-url
// takes them.
func (c *Cluster) URLs() string {
	urls := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		urls[i] = n.URL()
	}
	return strings.Join(urls, ",")
}

// Start starts node i (again) on its store and ports. It fails the test
// when the node does not accept connections within ten seconds.
func (c *Cluster) Start(tb testing.TB, i int) {
	tb.Helper()
	n := c.nodes[i]
	opts := &server.Options{
		ServerName: n.name,
		Host:       "127.0.0.1",
		Port:       n.port,
		JetStream:  true,
		StoreDir:   n.store,
		NoSigs:     true,
		HTTPPort:   0,
		Cluster:    server.ClusterOpts{Name: "cgtest", Host: "127.0.0.1", Port: n.clusterPort},
		Routes:     server.RoutesFromStr(strings.Join(n.routes, ",")),
	}
	var (
		srv *server.Server
		err error
	)
	// A stopped node's ports can take a moment to be released.
	deadline := time.Now().Add(10 * time.Second)
	for {
		srv, err = server.NewServer(opts)
		if err == nil {
			srv.Start()
			if srv.ReadyForConnections(10 * time.Second) {
				break
			}
			srv.Shutdown()
			srv.WaitForShutdown()
			err = fmt.Errorf("not ready for connections")
		}
		if time.Now().After(deadline) {
			tb.Fatalf("natstest: start cluster node %s: %v", n.name, err)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	n.mu.Lock()
	n.srv = srv
	n.mu.Unlock()
}

// WaitFormed waits (up to a minute) until one running node is the JetStream
// meta leader and sees every other node current.
func (c *Cluster) WaitFormed(tb testing.TB) {
	tb.Helper()
	deadline := time.Now().Add(time.Minute)
	for !c.formed() {
		if time.Now().After(deadline) {
			tb.Fatalf("natstest: cluster of %d did not form within a minute", len(c.nodes))
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (c *Cluster) formed() bool {
	for _, n := range c.nodes {
		srv := n.NATS()
		if srv == nil || !srv.JetStreamIsLeader() {
			continue
		}
		jsz, err := srv.Jsz(&server.JSzOptions{})
		if err != nil || jsz.Meta == nil || len(jsz.Meta.Replicas) != len(c.nodes)-1 {
			return false
		}
		for _, r := range jsz.Meta.Replicas {
			if !r.Current || r.Offline {
				return false
			}
		}
		return true
	}
	return false
}

// Connect opens a connection to node i only, that reconnects forever and is
// closed by tb.Cleanup.
func (c *Cluster) Connect(tb testing.TB, i int) *nats.Conn {
	tb.Helper()
	nc, err := nats.Connect(c.nodes[i].URL(), nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	if err != nil {
		tb.Fatalf("natstest: connect to cluster node %d: %v", i, err)
		return nil
	}
	tb.Cleanup(nc.Close)
	return nc
}

// Name is the node's server name.
func (n *Node) Name() string { return n.name }

// URL is the node's client URL (the same across restarts).
func (n *Node) URL() string { return fmt.Sprintf("nats://127.0.0.1:%d", n.port) }

// NATS returns the running server, or nil when the node is stopped.
func (n *Node) NATS() *server.Server {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.srv
}

// Shutdown stops the node and waits until it has stopped. It is safe to
// call on a stopped node.
func (n *Node) Shutdown() {
	n.mu.Lock()
	srv := n.srv
	n.srv = nil
	n.mu.Unlock()
	if srv == nil {
		return
	}
	srv.Shutdown()
	srv.WaitForShutdown()
}
