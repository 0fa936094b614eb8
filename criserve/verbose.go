package criserve

import (
	"context"
	"fmt"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// maxVerbose bounds the verbose answers kept: containerd's carry the OCI
// spec, ~10-20 KiB each, so 512 take at most ~10 MiB.
const maxVerbose = 512

// verboseCache keeps the runtime's verbose status answers while pleg's
// state of their item is unchanged (the key carries it), and makes the
// callers that ask for the same one at once share one runtime call: when
// every agent asks for a new container's verbose status, the runtime
// answers once.
type verboseCache struct {
	// stopping cancels every fetch (the server stops).
	stopping context.Context
	// fetches are the goroutines fetching; Serve waits for them.
	fetches sync.WaitGroup

	mu      sync.Mutex
	entries map[string]*verboseEntry
}

type verboseEntry struct {
	done      chan struct{} // closed when resp or err is set
	resp      any
	err       error
	waiters   int                // callers waiting for done
	cancel    context.CancelFunc // ends the fetch
	abandoned bool               // every waiter left: the fetch is cancelled
}

// get returns the answer for key, fetching it (once for every caller that
// asks for key meanwhile) unless it is kept. The fetch runs on its own
// goroutine, with ctx's values but not its end: it ends when the server
// stops, when it is done, or when every caller waiting for it has gone.
// A failed fetch is not kept: the next caller fetches again.
func (c *verboseCache) get(ctx context.Context, key string, fetch func(context.Context) (any, error)) (any, error) {
	c.mu.Lock()
	if c.entries == nil {
		c.entries = map[string]*verboseEntry{}
	}
	e, ok := c.entries[key]
	if !ok || e.abandoned {
		if len(c.entries) >= maxVerbose {
			// Start afresh: the answers of removed items go with the
			// others, which the next callers fetch again.
			for k, old := range c.entries {
				select {
				case <-old.done:
					delete(c.entries, k)
				default:
				}
			}
		}
		fctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		stop := context.AfterFunc(c.stopping, cancel)
		e = &verboseEntry{done: make(chan struct{}), cancel: cancel}
		c.entries[key] = e
		c.fetches.Add(1)
		go func() {
			defer c.fetches.Done()
			resp, err := fetch(fctx)
			stop()
			cancel()
			c.mu.Lock()
			e.resp, e.err = resp, err
			if err != nil && c.entries[key] == e {
				delete(c.entries, key)
			}
			c.mu.Unlock()
			close(e.done)
		}()
	}
	e.waiters++
	c.mu.Unlock()
	select {
	case <-e.done:
		c.mu.Lock()
		e.waiters--
		c.mu.Unlock()
		return e.resp, e.err
	case <-ctx.Done():
		c.mu.Lock()
		e.waiters--
		if e.waiters == 0 {
			select {
			case <-e.done:
			default:
				e.abandoned = true
				e.cancel()
			}
		}
		c.mu.Unlock()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

// verboseKey names an item's verbose answer in pleg's current state of it.
func verboseKey(method, id string, state fmt.Stringer) string {
	return method + "/" + id + "/" + state.String()
}

// typed returns v as T, or an Internal error.
func typed[T any](v any, err error) (T, error) {
	var zero T
	if err != nil {
		return zero, err
	}
	t, ok := v.(T)
	if !ok {
		return zero, status.Errorf(codes.Internal, "verbose cache: %T", v)
	}
	return t, nil
}
