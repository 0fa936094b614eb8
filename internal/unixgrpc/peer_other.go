//go:build !linux

package unixgrpc

import "errors"

// socketPeer is Linux's SO_PEERCRED only.
func socketPeer(int) (Peer, error) {
	return Peer{}, errors.New("peer credentials are read on Linux only")
}
