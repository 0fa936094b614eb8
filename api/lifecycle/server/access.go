package server

import (
	"net"
	"os"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/podlifecycle/pleg/internal/unixgrpc"
)

// DefaultSocketPath is where pleg run serves the API by default.
const DefaultSocketPath = "/run/pleg/pleg.sock"

// DefaultSocketMode is the socket file's default mode: its owner (root)
// and its group may connect.
const DefaultSocketMode os.FileMode = 0o660

// Peer is the process at the other end of a unix socket connection
// (unixgrpc.Peer).
type Peer = unixgrpc.Peer

// PeerInfo is the credentials.AuthInfo of a unix socket connection
// (unixgrpc.PeerInfo): gRPC handlers find it in
// peer.FromContext(ctx).AuthInfo.
type PeerInfo = unixgrpc.PeerInfo

// Access restricts who may connect over the unix socket (unixgrpc.Access).
type Access = unixgrpc.Access

// ErrPeerNotAllowed is the handshake error of a peer that no allowed UID
// or GID lists.
var ErrPeerNotAllowed = unixgrpc.ErrPeerNotAllowed

// NewPeerCredentials returns the transport credentials of a unix socket
// serving api (unixgrpc.NewPeerCredentials).
func NewPeerCredentials(api string, access Access, log logr.Logger, rejected prometheus.Counter) credentials.TransportCredentials {
	return unixgrpc.NewPeerCredentials(api, access, log, rejected)
}

// ListenUnix listens on a unix socket at path with the file mode and group
// given (unixgrpc.Listen).
func ListenUnix(path string, mode os.FileMode, gid int) (net.Listener, error) {
	return unixgrpc.Listen(path, mode, gid)
}

// LimitListener returns ln accepting at most n connections at once
// (unixgrpc.LimitListener).
func LimitListener(ln net.Listener, n int) net.Listener { return unixgrpc.LimitListener(ln, n) }

// StopAll stops every server at once, each gracefully for at most timeout
// (unixgrpc.StopAll).
func StopAll(servers []*grpc.Server, timeout time.Duration) { unixgrpc.StopAll(servers, timeout) }
