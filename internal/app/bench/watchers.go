package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	lifecyclev1 "github.com/podlifecycle/pleg/api/lifecycle/v1"
)

// watchers are lifecycle API watchers (LiveRun.Watchers) the bench opens
// on pleg's child, each a Watch without a cursor or filter on a
// connection of its own, as separate agents would: each reads every
// message as it comes (a reading watcher), or, on a node where nothing
// changes, holds its stream open after the snapshot (an idle one).
type watchers struct {
	cancel context.CancelFunc
	conns  []*grpc.ClientConn
	wg     sync.WaitGroup
	msgs   atomic.Int64 // messages received, all watchers
	ready  atomic.Int64 // watchers whose snapshot ended
	mu     sync.Mutex
	err    error // the first stream that ended while open
}

// watchersReady bounds the wait for every watcher's snapshot.
const watchersReady = time.Minute

// openWatchers opens n watchers on the lifecycle API at path and waits
// until each has received its snapshot.
func openWatchers(ctx context.Context, path string, n int) (*watchers, error) {
	ctx, cancel := context.WithCancel(ctx)
	w := &watchers{cancel: cancel}
	for range n {
		conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			w.close()
			return nil, err
		}
		w.conns = append(w.conns, conn)
		stream, err := lifecyclev1.NewLifecycleClient(conn).Watch(ctx, &lifecyclev1.WatchRequest{})
		if err != nil {
			w.close()
			return nil, fmt.Errorf("opening watcher %d of %d: %w", len(w.conns), n, err)
		}
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			for {
				m, err := stream.Recv()
				if err != nil {
					if ctx.Err() == nil {
						w.mu.Lock()
						if w.err == nil {
							w.err = fmt.Errorf("a watcher's stream ended: %w", err)
						}
						w.mu.Unlock()
					}
					return
				}
				w.msgs.Add(1)
				if m.GetSnapshotEnd() != nil {
					w.ready.Add(1)
				}
			}
		}()
	}
	deadline := time.Now().Add(watchersReady)
	for w.ready.Load() < int64(n) {
		if err := w.failed(); err != nil {
			w.close()
			return nil, err
		}
		if time.Now().After(deadline) {
			w.close()
			return nil, fmt.Errorf("%d of %d watchers had their snapshot after %v", w.ready.Load(), n, watchersReady)
		}
		if err := sleep(ctx, 10*time.Millisecond); err != nil {
			w.close()
			return nil, err
		}
	}
	return w, nil
}

// failed returns the first error of a stream that ended while open.
func (w *watchers) failed() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// close ends every watcher and returns failed's error.
func (w *watchers) close() error {
	w.cancel()
	w.wg.Wait()
	var errs []error
	for _, c := range w.conns {
		errs = append(errs, c.Close())
	}
	return errors.Join(append([]error{w.failed()}, errs...)...)
}
