package e2e

// An event source a test puts in front of a library view's client
// (startLib fills in the client) to cut its runtime event stream and let it
// reconnect (TestEventStreamReplay22).

import (
	"context"
	"sync"

	"github.com/podlifecycle/pleg/cruntime"
)

// gatedSource is an event source the test can cut and reconnect: cut
// ends the current stream and holds the generator's reconnection until
// open.
type gatedSource struct {
	src    cruntime.EventSource
	mu     sync.Mutex
	open   chan struct{} // closed while the gate is open
	cancel context.CancelFunc
	calls  int
}

func newGatedSource() *gatedSource {
	g := &gatedSource{open: make(chan struct{})}
	close(g.open)
	return g
}

func (g *gatedSource) WatchEvents(ctx context.Context, connected func(), fn func(cruntime.Event)) error {
	g.mu.Lock()
	open := g.open
	g.mu.Unlock()
	select {
	case <-open:
	case <-ctx.Done():
		return ctx.Err()
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	g.mu.Lock()
	g.cancel = cancel
	g.calls++
	g.mu.Unlock()
	return g.src.WatchEvents(ctx, connected, fn)
}

func (g *gatedSource) cut() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.open = make(chan struct{})
	if g.cancel != nil {
		g.cancel()
	}
}

func (g *gatedSource) reopen() {
	g.mu.Lock()
	defer g.mu.Unlock()
	close(g.open)
}
