package server

import (
	"sync"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	_ "google.golang.org/grpc/encoding/proto" // registers the "proto" codec

	"github.com/podlifecycle/pleg/journal"
)

// encoded is a WatchResponse already in its wire form: every watcher that
// sends the same journal entry sends the same bytes, encoded once.
type encoded struct{ b []byte }

// serverCodec is gRPC's proto codec, except that an *encoded message is
// sent as it is.
type serverCodec struct{ encoding.CodecV2 }

func newServerCodec() serverCodec { return serverCodec{encoding.GetCodecV2("proto")} }

func (c serverCodec) Marshal(v any) (mem.BufferSlice, error) {
	if e, ok := v.(*encoded); ok {
		// A SliceBuffer is not pooled: gRPC only reads it, and freeing it
		// does nothing, so the bytes stay shared.
		return mem.BufferSlice{mem.SliceBuffer(e.b)}, nil
	}
	return c.CodecV2.Marshal(v)
}

// cacheSize is how many recent entries' encodings are kept (for each
// identity choice): watchers read near the journal's head, so one that
// sends an entry finds it encoded by the first that did.
const cacheSize = 4096

// encodeCache holds the wire form of recent entries' messages.
type encodeCache struct {
	mu    sync.Mutex
	slots [2][cacheSize]cacheSlot
}

type cacheSlot struct {
	seq uint64
	msg *encoded
}

// get returns the encoded message of m, an Event or Runtime message (whose
// bytes depend only on its entry and identity), encoding it the first
// time. nil: m cannot be encoded.
func (c *encodeCache) get(m journal.Message, identity bool) *encoded {
	side := 0
	if identity {
		side = 1
	}
	slot := &c.slots[side][m.Cursor.Seq%cacheSize]
	c.mu.Lock()
	defer c.mu.Unlock()
	if slot.msg != nil && slot.seq == m.Cursor.Seq {
		return slot.msg
	}
	resp := WatchResponse(m, identity)
	if resp == nil {
		return nil
	}
	b, err := proto.Marshal(resp)
	if err != nil {
		return nil
	}
	slot.seq, slot.msg = m.Cursor.Seq, &encoded{b: b}
	return slot.msg
}
