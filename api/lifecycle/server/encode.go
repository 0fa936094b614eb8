package server

import (
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
// A lifecycle request it cannot decode is noted in bad (see decode.go).
type serverCodec struct {
	encoding.CodecV2
	bad *badRequests
}

func newServerCodec(bad *badRequests) serverCodec {
	return serverCodec{CodecV2: encoding.GetCodecV2("proto"), bad: bad}
}

func (c serverCodec) Unmarshal(data mem.BufferSlice, v any) error {
	err := c.CodecV2.Unmarshal(data, v)
	if err != nil && c.bad != nil && lifecycleRequest(v) {
		c.bad.put(v, err)
		return nil
	}
	return err
}

func (c serverCodec) Marshal(v any) (mem.BufferSlice, error) {
	if e, ok := v.(*encoded); ok {
		// A SliceBuffer is not pooled: gRPC only reads it, and freeing it
		// does nothing, so the bytes stay shared.
		return mem.BufferSlice{mem.SliceBuffer(e.b)}, nil
	}
	return c.CodecV2.Marshal(v)
}

// encodeCacheSize is how many recent entries' encodings are kept (for each
// identity choice; 7 MiB for 4,096 events of a kubelet pod of three
// containers): watchers that fall seconds behind under a burst still find
// the entries encoded (BenchmarkFanout).
const encodeCacheSize = 4096

// encode returns the wire form of m, an Event or Runtime message (whose
// bytes depend only on its entry and identity), encoding it the first time
// a watcher sends its entry. nil: m cannot be encoded.
func (s *Server) encode(m journal.Message, identity bool) *encoded {
	e, _ := s.encoded.Get(m.Cursor.Seq, identity, func() (*encoded, bool) {
		resp := WatchResponse(m, identity)
		if resp == nil {
			return nil, false
		}
		b, err := proto.Marshal(resp)
		if err != nil {
			return nil, false
		}
		return &encoded{b: b}, true
	})
	return e
}
