package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// stream is a fake gRPC server stream: SendMsg blocks until the client
// reads the message (read) or the stream ends (end: the handler returned),
// as grpc-go's does on a client's flow control, and every call, return and
// the handler's return go to one log, in order.
type stream struct {
	mu   sync.Mutex
	log  []string
	read chan struct{} // one token a message taken
	end  chan struct{} // closed when the handler returns
}

func newStream() *stream {
	return &stream{read: make(chan struct{}, 100), end: make(chan struct{})}
}

func (s *stream) note(e string) {
	s.mu.Lock()
	s.log = append(s.log, e)
	s.mu.Unlock()
}

func (s *stream) SendMsg(m string) error {
	s.note("call " + m)
	defer s.note("return " + m)
	select {
	case <-s.read:
		return nil
	case <-s.end:
		return errors.New("stream done")
	}
}

// returned is the handler's return: it ends the stream.
func (s *stream) returned() {
	s.note("handler returned")
	close(s.end)
}

// afterReturn returns what the stream saw after the handler returned.
func (s *stream) afterReturn() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := slices.Index(s.log, "handler returned")
	if i < 0 {
		return nil
	}
	return slices.Clone(s.log[i+1:])
}

func grpcOutbox(s *stream, stall time.Duration) (*GRPC[string], context.Context, *sync.WaitGroup) {
	ctx, cancel := context.WithCancelCause(context.Background())
	var senders sync.WaitGroup
	ob := ForGRPC(GRPCConfig[string]{Max: 10, StallTimeout: stall, Send: s.SendMsg,
		Cancel: cancel, Cut: errors.New("cut"), Senders: &senders})
	return ob, ctx, &senders
}

// A handler that returns while a message is in flight to a client that
// reads returns after its SendMsg did, never before: nothing touches the
// stream once the handler has returned.
func TestGRPCNoSendMsgAfterReturn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newStream()
		ob, _, senders := grpcOutbox(s, time.Hour)
		for _, m := range []string{"a", "b"} {
			if err := ob.Push(context.Background(), m); err != nil {
				t.Fatal(err)
			}
		}
		synctest.Wait() // "a" is in SendMsg, "b" waits
		handler := make(chan struct{})
		go func() {
			defer close(handler)
			ob.Close()
			s.returned()
		}()
		synctest.Wait()
		s.read <- struct{}{} // the client takes "a"
		<-handler
		senders.Wait()
		if after := s.afterReturn(); len(after) > 0 {
			t.Errorf("the stream was used after the handler returned: %q (log %q)", after, s.log)
		}
		if !slices.Contains(s.log, "return a") || slices.Contains(s.log, "call b") {
			t.Errorf("log %q: want a's SendMsg to return, and b's never to begin", s.log)
		}
	})
}

// A Send that the sender had begun before the handler returned, but which
// had not reached SendMsg yet, does not call it once Close has returned.
func TestGRPCNoSendMsgBegunAfterClose(t *testing.T) {
	s := newStream()
	ob, _, senders := grpcOutbox(s, time.Hour)
	ob.Close()
	s.returned()
	err := ob.cfg.Send("late", func() {})
	if !errors.Is(err, ErrClosed) {
		t.Errorf("Send after Close = %v, want ErrClosed", err)
	}
	if after := s.afterReturn(); len(after) > 0 {
		t.Errorf("the stream was used after the handler returned: %q", after)
	}
	senders.Wait()
}

// A client that takes nothing holds the handler no longer than the
// existing bounds: CloseGrace past the handler's end, nothing more once it
// was cut off for stalling; the handler's return then ends the SendMsg.
func TestGRPCCloseBounded(t *testing.T) {
	for _, cut := range []bool{false, true} {
		t.Run(fmt.Sprintf("cut=%v", cut), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const stall = 10 * time.Second
				s := newStream()
				ob, ctx, senders := grpcOutbox(s, stall)
				if err := ob.Push(context.Background(), "stuck"); err != nil {
					t.Fatal(err)
				}
				synctest.Wait()
				want := CloseGrace
				if cut {
					time.Sleep(stall)
					synctest.Wait()
					var drop *DropError
					if !errors.As(ob.Err(), &drop) || context.Cause(ctx) == nil {
						t.Fatalf("after the stall timeout: Err() = %v, cause %v; want a DropError and a cancelled handler", ob.Err(), context.Cause(ctx))
					}
					want = 0
				}
				start := time.Now()
				ob.Close()
				if d := time.Since(start); d != want {
					t.Errorf("Close took %v, want %v", d, want)
				}
				s.returned()
				senders.Wait() // the stream's end made SendMsg return
				if after := s.afterReturn(); !slices.Equal(after, []string{"return stuck"}) {
					t.Errorf("after the handler returned: %q, want only the blocked SendMsg's return", after)
				}
			})
		})
	}
}
