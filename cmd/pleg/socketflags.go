package main

import (
	"fmt"
	"net"
	"os"

	"github.com/podlifecycle/pleg/api/lifecycle/server"
)

// socketFlags are the flags of a unix socket pleg serves a gRPC API on
// (--lifecycle-socket, --cri-socket, --cri-pod-socket): its path, file
// mode and group, and the peers allowed besides the mode. Each command
// registers the flags with its own help; the rules (parsing, checking,
// listening) are these.
type socketFlags struct {
	// name is the path's flag ("cri-socket"); the mode's is name-mode,
	// the group's name-group.
	name string
	// peers prefixes the allowed peers' flags ("cri-allowed":
	// --cri-allowed-uids, --cri-allowed-gids).
	peers string

	path, modeValue, group   string
	allowedUIDs, allowedGIDs []uint

	// Set by validate.
	mode os.FileMode
	gid  int // -1: pleg's group
}

// validate parses the mode and the group and checks the allowed IDs.
func (s *socketFlags) validate() error {
	var err error
	if s.mode, err = socketMode(s.name+"-mode", s.modeValue); err != nil {
		return err
	}
	s.gid = -1
	if s.group != "" {
		if s.gid, err = lookupGroup(s.group); err != nil {
			return usageErrorf("invalid --%s-group %q: %v", s.name, s.group, err)
		}
	}
	for _, l := range []struct {
		name string
		ids  []uint
	}{{"uids", s.allowedUIDs}, {"gids", s.allowedGIDs}} {
		for _, id := range l.ids {
			if id > 1<<32-1 {
				return usageErrorf("invalid --%s-%s %d: too large", s.peers, l.name, id)
			}
		}
	}
	return nil
}

// access is the peer check of the allowed IDs.
func (s *socketFlags) access() server.Access {
	return server.Access{AllowedUIDs: toUint32s(s.allowedUIDs), AllowedGIDs: toUint32s(s.allowedGIDs)}
}

// listen makes the socket, with its mode and group set before it appears.
func (s *socketFlags) listen() (net.Listener, error) {
	ln, err := server.ListenUnix(s.path, s.mode, s.gid)
	if err != nil {
		return nil, fmt.Errorf("cannot listen on --%s %s: %w (set --%s to another path, or to \"\" for none)", s.name, s.path, err, s.name)
	}
	return ln, nil
}

func toUint32s(ids []uint) []uint32 {
	out := make([]uint32, len(ids))
	for i, id := range ids {
		out[i] = uint32(id)
	}
	return out
}
