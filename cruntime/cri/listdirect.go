package cri

import (
	"context"

	"google.golang.org/protobuf/proto"

	"github.com/podlifecycle/pleg/cruntime/cri/directlist"
)

// Direct listings. gRPC hands a codec a message only once all of it has
// arrived: the relist's two unfiltered listings (unary or streamed) are
// megabytes on a big node, held in frame buffers while they are decoded,
// the biggest thing pleg keeps in memory. So they go over an HTTP/2
// connection of their own instead (package directlist), and are decoded as
// their bytes arrive. Every other call, filtered listings included, goes
// through the client's gRPC connection. WithDirectLists(false) lists
// through gRPC too. Either way the outcome of a listing is the same
// (directlist's contract; transport_conformance_test.go).

// WithDirectLists sets whether the relist's unfiltered listings are read
// from a connection of their own and decoded as they arrive (true, the
// default) or through the client's gRPC connection, which holds each reply
// (or each streamed batch) whole in memory before decoding it. The calls
// the runtime serves, the items decoded and the errors are the same either
// way.
func WithDirectLists(on bool) Option {
	return func(o *options) { o.grpcLists = !on }
}

// lister makes the unfiltered list calls of the direct listings
// (*directlist.Lister): method is the call's full name, decode gets each
// message of the reply as it arrives, and errors carry a gRPC status as
// the gRPC connection's do.
type lister interface {
	Call(ctx context.Context, method string, req proto.Message, unary bool, decode func(*directlist.Message) error) (int, error)
	Close()
}
