package unixgrpc

import "syscall"

// socketPeer returns the credentials of the peer of unix socket fd.
func socketPeer(fd int) (Peer, error) {
	c, err := syscall.GetsockoptUcred(fd, syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	if err != nil {
		return Peer{}, err
	}
	return Peer{UID: c.Uid, GID: c.Gid, PID: c.Pid}, nil
}
