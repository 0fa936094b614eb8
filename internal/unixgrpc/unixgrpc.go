// Package unixgrpc serves gRPC on a node-local unix socket: who may
// connect (Access, checked in the handshake by NewPeerCredentials, which
// hands each call its Peer), the socket file (Listen), a bound on
// connections (LimitListener) and the servers' shutdown (StopAll). The
// lifecycle API and the CRI endpoint both use it.
package unixgrpc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/credentials"
)

// Peer is the process at the other end of a unix socket connection, as
// the kernel reports it (SO_PEERCRED) when it connected.
type Peer struct {
	UID, GID uint32
	PID      int32
	// Command is the process's name (/proc/PID/comm) when it could be
	// read, for logs.
	Command string
}

func (p Peer) String() string {
	s := fmt.Sprintf("uid=%d gid=%d pid=%d", p.UID, p.GID, p.PID)
	if p.Command != "" {
		s += " command=" + p.Command
	}
	return s
}

// PeerInfo is the credentials.AuthInfo of a unix socket connection: gRPC
// handlers find it in peer.FromContext(ctx).AuthInfo.
type PeerInfo struct {
	credentials.CommonAuthInfo
	Peer Peer
}

// AuthType implements credentials.AuthInfo.
func (PeerInfo) AuthType() string { return "unix-peer" }

// ErrPeerNotAllowed is the handshake error of a peer that no allowed UID
// or GID lists.
var ErrPeerNotAllowed = errors.New("peer not allowed")

// Access restricts who may connect over the unix socket. The socket
// file's mode and group are the first boundary; these lists a second one.
// With both lists empty, every process that can open the socket is
// allowed; otherwise a process whose UID is in AllowedUIDs or whose
// primary GID is in AllowedGIDs (UID 0 is not implied: list it).
type Access struct {
	AllowedUIDs []uint32
	AllowedGIDs []uint32
}

// Restricted reports whether a is more than the socket's permissions.
func (a Access) Restricted() bool { return len(a.AllowedUIDs) > 0 || len(a.AllowedGIDs) > 0 }

// Allows reports whether a allows p.
func (a Access) Allows(p Peer) bool {
	return !a.Restricted() || slices.Contains(a.AllowedUIDs, p.UID) || slices.Contains(a.AllowedGIDs, p.GID)
}

// peerCredentials are the transport credentials of the unix socket: the
// handshake reads the peer's credentials, logs them and refuses a peer
// that access does not allow. The connection itself is not changed (a
// unix socket on the node needs no encryption).
type peerCredentials struct {
	api      string // what is served, for logs and errors: "lifecycle API"
	access   Access
	log      logr.Logger
	rejected prometheus.Counter // nil: not counted
}

// NewPeerCredentials returns the transport credentials of a unix socket
// serving api (named in logs and errors, e.g. "CRI endpoint"): each
// connection's peer credentials (SO_PEERCRED) are read and logged, a peer
// that access does not allow is refused (and counted in rejected, if not
// nil), and the others' calls find a PeerInfo in
// peer.FromContext(ctx).AuthInfo.
func NewPeerCredentials(api string, access Access, log logr.Logger, rejected prometheus.Counter) credentials.TransportCredentials {
	return &peerCredentials{api: api, access: access, log: log, rejected: rejected}
}

func (c *peerCredentials) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return nil, nil, fmt.Errorf("%s: peer credentials need a unix socket connection, not %T", c.api, conn)
	}
	p, err := peerOf(sc)
	if err != nil {
		c.log.Error(err, "Cannot read a client's credentials; closing its connection", "api", c.api)
		return nil, nil, err
	}
	if !c.access.Allows(p) {
		if c.rejected != nil {
			c.rejected.Inc()
		}
		c.log.Info("Refused a "+c.api+" client: neither its UID nor its GID is allowed", "peer", p.String(),
			"allowedUIDs", c.access.AllowedUIDs, "allowedGIDs", c.access.AllowedGIDs)
		return nil, nil, fmt.Errorf("%w: %s", ErrPeerNotAllowed, p)
	}
	c.log.Info(strings.ToUpper(c.api[:1])+c.api[1:]+" client connected", "uid", p.UID, "gid", p.GID, "pid", p.PID, "command", p.Command)
	return conn, PeerInfo{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity}, Peer: p}, nil
}

func (c *peerCredentials) ClientHandshake(context.Context, string, net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, fmt.Errorf("%s: peer credentials are server-side only", c.api)
}

func (c *peerCredentials) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "unix-peer"}
}

func (c *peerCredentials) Clone() credentials.TransportCredentials {
	cp := *c
	return &cp
}

func (c *peerCredentials) OverrideServerName(string) error { return nil }

// peerOf reads the credentials of a unix socket's peer.
func peerOf(sc syscall.Conn) (Peer, error) {
	raw, err := sc.SyscallConn()
	if err != nil {
		return Peer{}, err
	}
	var p Peer
	var credErr error
	if err := raw.Control(func(fd uintptr) { p, credErr = socketPeer(int(fd)) }); err != nil {
		return Peer{}, err
	}
	if credErr != nil {
		return Peer{}, fmt.Errorf("reading the peer's credentials (SO_PEERCRED): %w", credErr)
	}
	if b, err := os.ReadFile("/proc/" + strconv.Itoa(int(p.PID)) + "/comm"); err == nil {
		p.Command = strings.TrimSpace(string(b))
	}
	return p, nil
}

// Listen listens on a unix socket at path with the file mode and group
// given (gid < 0: the process's), creating its directory if needed. The
// socket appears at path only once its mode and group are set (it is
// made under a temporary name, then renamed), so no client can connect
// with looser permissions. A stale socket at path (nothing accepts on it)
// is replaced; a live one, or a file that is not a socket, is an error.
// Closing the listener removes the socket file.
func Listen(path string, mode os.FileMode, gid int) (net.Listener, error) {
	if path == "" {
		return nil, errors.New("empty socket path")
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	if err := removeStale(path); err != nil {
		return nil, err
	}
	// A short temporary name: a unix socket's path is at most 107 bytes.
	tmp := filepath.Join(filepath.Dir(path), fmt.Sprintf(".pleg-%d", os.Getpid()))
	_ = os.Remove(tmp)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return nil, err
	}
	ln.SetUnlinkOnClose(false)
	fail := func(err error) (net.Listener, error) {
		ln.Close()
		_ = os.Remove(tmp)
		return nil, err
	}
	if err := os.Chmod(tmp, mode.Perm()); err != nil {
		return fail(err)
	}
	if gid >= 0 {
		if err := os.Chown(tmp, -1, gid); err != nil {
			return fail(fmt.Errorf("setting the socket's group to %d: %w", gid, err))
		}
	}
	if err := os.Rename(tmp, path); err != nil {
		return fail(err)
	}
	fi, err := os.Lstat(path)
	if err != nil {
		return fail(err)
	}
	return &unixListener{UnixListener: ln, path: path, file: fi}, nil
}

// removeStale removes a socket at path that nothing accepts on.
func removeStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("%s exists and is not a socket; not replacing it", path)
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		c.Close()
		return fmt.Errorf("%s is in use: another process accepts connections on it", path)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("%s: cannot tell whether it is in use: %w", path, err)
	}
	return os.Remove(path)
}

// unixListener removes its socket file when closed, if the file is still
// the one it made.
type unixListener struct {
	*net.UnixListener
	path string
	file os.FileInfo
}

// Addr is the socket's path (not the temporary name it was made under).
func (l *unixListener) Addr() net.Addr { return &net.UnixAddr{Name: l.path, Net: "unix"} }

func (l *unixListener) Close() error {
	err := l.UnixListener.Close()
	if fi, serr := os.Lstat(l.path); serr == nil && os.SameFile(fi, l.file) {
		_ = os.Remove(l.path)
	}
	return err
}

// limitListener accepts at most n connections at once: Accept waits for
// one to close beyond that.
type limitListener struct {
	net.Listener
	slots chan struct{}
	done  chan struct{}
	once  sync.Once
}

func newLimitListener(ln net.Listener, n int) *limitListener {
	return &limitListener{Listener: ln, slots: make(chan struct{}, n), done: make(chan struct{})}
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.slots <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	return &limitedConn{Conn: c, release: func() { <-l.slots }}, nil
}

func (l *limitListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// limitedConn gives its slot back when closed; it keeps the connection's
// file descriptor reachable (syscall.Conn) for the peer's credentials.
type limitedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

func (c *limitedConn) SyscallConn() (syscall.RawConn, error) {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return nil, fmt.Errorf("%T has no file descriptor", c.Conn)
	}
	return sc.SyscallConn()
}

// LimitListener returns ln accepting at most n connections at once: Accept
// waits for one to close beyond that. Its connections keep their file
// descriptor reachable (syscall.Conn) for the peer's credentials.
func LimitListener(ln net.Listener, n int) net.Listener { return newLimitListener(ln, n) }
