package jina

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"time"
)

// The dial guard stops the HTTP tool from reaching the executor's own
// network (SSRF): whatever a host name resolves to, and wherever a redirect
// points, the address actually dialed is checked at dial time, after DNS
// resolution, so DNS rebinding cannot slip past it.

// blockedAddrError is a dial the guard refused.
type blockedAddrError struct {
	Addr   netip.AddrPort
	Reason string
}

func (e *blockedAddrError) Error() string {
	return fmt.Sprintf("refused to connect to %s: %s address", e.Addr, e.Reason)
}

// blockedPrefixes are the non-public ranges the guard refuses, with why.
// IPv4-mapped IPv6 addresses are unmapped before they are checked.
var blockedPrefixes = []struct {
	prefix netip.Prefix
	reason string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), "unspecified (this-network)"},
	{netip.MustParsePrefix("10.0.0.0/8"), "private (RFC 1918)"},
	{netip.MustParsePrefix("100.64.0.0/10"), "shared (carrier-grade NAT, RFC 6598)"},
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local"},
	{netip.MustParsePrefix("172.16.0.0/12"), "private (RFC 1918)"},
	{netip.MustParsePrefix("192.0.0.0/24"), "IETF protocol assignment"},
	{netip.MustParsePrefix("192.168.0.0/16"), "private (RFC 1918)"},
	{netip.MustParsePrefix("198.18.0.0/15"), "benchmarking"},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved"}, // includes 255.255.255.255
	{netip.MustParsePrefix("::/128"), "unspecified"},
	{netip.MustParsePrefix("::1/128"), "loopback"},
	{netip.MustParsePrefix("::/96"), "IPv4-compatible"},
	{netip.MustParsePrefix("100::/64"), "discard-only"},
	{netip.MustParsePrefix("fc00::/7"), "private (unique local)"},
	{netip.MustParsePrefix("fe80::/10"), "link-local"},
	{netip.MustParsePrefix("fec0::/10"), "site-local"},
	{netip.MustParsePrefix("ff00::/8"), "multicast"},
}

// Transition prefixes that embed an IPv4 address: the embedded address is
// checked too (a NAT64 or 6to4 path to 10.0.0.1 is still 10.0.0.1).
var (
	nat64Prefix      = netip.MustParsePrefix("64:ff9b::/96")
	nat64LocalPrefix = netip.MustParsePrefix("64:ff9b:1::/48")
	sixToFourPrefix  = netip.MustParsePrefix("2002::/16")
)

// checkIP reports why ip may not be dialed, or "" when it may.
func checkIP(ip netip.Addr) string {
	if !ip.IsValid() {
		return "invalid"
	}
	ip = ip.Unmap().WithZone("")
	if ip.IsLoopback() {
		return "loopback"
	}
	if ip.IsUnspecified() {
		return "unspecified"
	}
	if ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() {
		return "link-local"
	}
	if ip.IsMulticast() || ip.IsInterfaceLocalMulticast() {
		return "multicast"
	}
	if ip.IsPrivate() {
		return "private"
	}
	for _, b := range blockedPrefixes {
		if b.prefix.Contains(ip) {
			return b.reason
		}
	}
	if ip.Is6() {
		a := ip.As16()
		var v4 netip.Addr
		switch {
		case nat64Prefix.Contains(ip):
			v4 = netip.AddrFrom4([4]byte{a[12], a[13], a[14], a[15]})
		case nat64LocalPrefix.Contains(ip):
			v4 = netip.AddrFrom4([4]byte{a[12], a[13], a[14], a[15]})
		case sixToFourPrefix.Contains(ip):
			v4 = netip.AddrFrom4([4]byte{a[2], a[3], a[4], a[5]})
		}
		if v4.IsValid() {
			if r := checkIP(v4); r != "" {
				return r + " (embedded in " + ip.String() + ")"
			}
		}
	}
	return ""
}

// dialGuard refuses dials to non-public addresses, except loopback
// addresses on explicitly allowed ports (tests run upstreams on loopback).
type dialGuard struct {
	loopbackPorts map[uint16]bool
	d             *net.Dialer
}

func newDialGuard(allowLoopbackPorts []int) *dialGuard {
	g := &dialGuard{loopbackPorts: map[uint16]bool{}}
	for _, p := range allowLoopbackPorts {
		if p > 0 && p <= 65535 {
			g.loopbackPorts[uint16(p)] = true
		}
	}
	g.d = &net.Dialer{
		Timeout:   10 * time.Second,
		KeepAlive: 30 * time.Second,
		Control:   g.control,
	}
	return g
}

// check is the guard's decision for one resolved address.
func (g *dialGuard) check(ap netip.AddrPort) error {
	ip := ap.Addr().Unmap().WithZone("")
	if ip.IsLoopback() && g.loopbackPorts[ap.Port()] {
		return nil
	}
	if r := checkIP(ip); r != "" {
		return &blockedAddrError{Addr: netip.AddrPortFrom(ip, ap.Port()), Reason: r}
	}
	return nil
}

// control runs after name resolution, just before each connect(2): address
// is the literal IP and port being dialed.
func (g *dialGuard) control(network, address string, _ syscall.RawConn) error {
	if !strings.HasPrefix(network, "tcp") {
		return fmt.Errorf("dial guard: network %q is not allowed", network)
	}
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("dial guard: cannot parse dialed address %q: %w", address, err)
	}
	return g.check(ap)
}

// DialContext dials through the guard: every address tried (a name may
// resolve to several) is checked just before it is connected to.
func (g *dialGuard) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	return g.d.DialContext(ctx, network, address)
}
