package server

import (
	"context"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	lifecyclev1 "github.com/podlifecycle/pleg/api/lifecycle/v1"
	"github.com/podlifecycle/pleg/internal/textfmt"
)

// An undecodable request is INVALID_ARGUMENT, as docs/stream.md's table
// says: the client sent bytes that are not the request, and retrying
// cannot help. gRPC itself answers a codec's error with INTERNAL before
// any handler or interceptor runs, so the server's codec does not fail a
// lifecycle request it cannot decode: it notes the message as undecodable
// (badRequests) and the interceptors, which see the message next, answer
// INVALID_ARGUMENT. Other services' messages (health, reflection) fail in
// the codec as gRPC has them.

// badRequests holds the lifecycle requests the codec could not decode,
// until the interceptor of their call takes them (at once: a message is
// decoded, then handed to the interceptor, on the call's goroutine).
type badRequests struct {
	mu sync.Mutex
	m  map[any]error
}

// lifecycleRequest reports whether v is a lifecycle service request.
func lifecycleRequest(v any) bool {
	switch v.(type) {
	case *lifecyclev1.WatchRequest, *lifecyclev1.ListPodsRequest, *lifecyclev1.GetPodRequest, *lifecyclev1.GetContainerRequest:
		return true
	}
	return false
}

func (b *badRequests) put(v any, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.m == nil {
		b.m = make(map[any]error)
	}
	b.m[v] = err
}

// take returns the decoding error of v, if it had one, and forgets it.
func (b *badRequests) take(v any) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	err, ok := b.m[v]
	if !ok {
		return nil
	}
	delete(b.m, v)
	return status.Error(codes.InvalidArgument, "undecodable request: "+textfmt.Bound(err.Error(), textfmt.ReasonMax))
}

func (b *badRequests) unary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := b.take(req); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func (b *badRequests) stream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	return handler(srv, &checkedStream{ServerStream: ss, bad: b})
}

// checkedStream answers an undecodable request INVALID_ARGUMENT.
type checkedStream struct {
	grpc.ServerStream
	bad *badRequests
}

func (s *checkedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	return s.bad.take(m)
}
