package sim_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/cruntime/cri"
	"github.com/podlifecycle/pleg/cruntime/sim"
)

// TestClientBehindCRIOMux serves the simulator behind the cmux matcher
// CRI-O puts in front of its socket (only content-type application/grpc
// gets through) and makes each kind of call the generator makes as the
// first call of a new connection, before and after the runtime restarts:
// a listing (streamed and unary), a single pod's listing, statuses and the
// event stream. A client whose list or event calls said
// application/grpc+proto had every such connection reset.
func TestClientBehindCRIOMux(t *testing.T) {
	for _, streaming := range []bool{true, false} {
		name := "unary-lists"
		if streaming {
			name = "streamed-lists"
		}
		t.Run(name, func(t *testing.T) {
			r := sim.New(sim.Config{Seed: 5, Pods: 3, ContainersPerPod: 2, CRIOMux: true, DisableListStreaming: !streaming})
			if err := r.Serve(filepath.Join(t.TempDir(), "crio.sock")); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(r.Stop)
			// Events emitted before the server registers a stream's
			// subscription are kept for it: the client's connected
			// callback cannot tell when that happened.
			r.SetKeepEvents(time.Hour)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()

			dial := func() *cri.Client {
				c, err := cri.Dial(r.Endpoint(), cri.WithTimeout(10*time.Second))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { c.Close() })
				return c
			}

			// Each call first on a connection of its own.
			pods, err := dial().ListPods(ctx)
			if err != nil {
				t.Fatalf("ListPods as a connection's first call: %v", err)
			}
			if len(pods) != 3 {
				t.Fatalf("listed %d pods, want 3", len(pods))
			}
			if p, err := dial().ListPod(ctx, pods[0].UID); err != nil || p == nil {
				t.Fatalf("ListPod as a connection's first call: %v %v", p, err)
			}
			if _, err := dial().PodStatus(ctx, pods[0]); err != nil {
				t.Fatalf("PodStatus as a connection's first call: %v", err)
			}
			if _, err := dial().Status(ctx); err != nil {
				t.Fatalf("Status as a connection's first call: %v", err)
			}
			if _, err := dial().ListDiscard(ctx); err != nil {
				t.Fatalf("ListDiscard as a connection's first call: %v", err)
			}
			watchOneEvent(ctx, t, r, dial(), pods[0].Containers[0].ID)

			// The runtime restarts under one client: the connection it
			// makes again must get through too. The client reconnects
			// with a backoff of at most a second, so this waits for the
			// listing to succeed; behind cmux with a refused content
			// type it never does.
			c := dial()
			if _, err := c.ListPods(ctx); err != nil {
				t.Fatal(err)
			}
			r.GoAway()
			if err := r.ComeBack(); err != nil {
				t.Fatal(err)
			}
			var last error
			wait, stop := context.WithTimeout(ctx, 20*time.Second)
			defer stop()
			for {
				pods, last = c.ListPods(wait)
				if last == nil || wait.Err() != nil {
					break
				}
				select {
				case <-wait.Done():
				case <-time.After(50 * time.Millisecond):
				}
			}
			if last != nil {
				t.Fatalf("ListPods after the runtime restarted never succeeded: %v", last)
			}
			watchOneEvent(ctx, t, r, c, pods[1].Containers[0].ID)
		})
	}
}

// watchOneEvent opens c's event stream, makes the runtime stop container
// id, and waits for its STOPPED event: proof the stream got through, not
// only that it was opened (the runtime keeps events for the stream it has
// not registered yet).
func watchOneEvent(ctx context.Context, t *testing.T, r *sim.Runtime, c *cri.Client, id string) {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	got := make(chan struct{})
	connected := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- c.WatchEvents(wctx, func() { close(connected) }, func(ev cruntime.Event) {
			if ev.ContainerID == id && ev.Type == cruntime.EventStopped {
				select {
				case <-got:
				default:
					close(got)
				}
			}
		})
	}()
	select {
	case <-connected:
	case err := <-done:
		t.Fatalf("WatchEvents ended before connecting: %v", err)
	}
	if err := r.ExitContainer(id, 3); err != nil {
		t.Fatal(err)
	}
	select {
	case <-got:
	case err := <-done:
		t.Fatalf("WatchEvents ended before the STOPPED event of %s: %v", id, err)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("WatchEvents after cancel: %v", err)
	}
}
