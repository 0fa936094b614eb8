package httpapi

import (
	"container/list"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// connLimiter caps the connections one listener serves at once. A
// connection that is not in a request (new, reading its request's headers,
// or idle between keep-alive requests) holds a slot but is evictable: when
// a new connection arrives with every slot taken, the one of them that has
// waited longest is closed to make room. Only when every slot is in a
// request is the new connection refused (a short 503, then closed, without
// a goroutine). Idle connections therefore cost at most the cap, and
// cannot lock probes and scrapes out; what they can still do is spend the
// accept loop's time.
type connLimiter struct {
	net.Listener
	max      int
	listener string // the metrics' listener label
	m        *serverMetrics

	mu   sync.Mutex
	open int
	idle list.List // of *trackedConn, longest waiting first
}

func newConnLimiter(ln net.Listener, max int, listener string, m *serverMetrics) *connLimiter {
	return &connLimiter{Listener: ln, max: max, listener: listener, m: m}
}

// trackedConn is a connection holding a slot of its limiter until closed.
type trackedConn struct {
	net.Conn
	l        *connLimiter
	elem     *list.Element // in l.idle while not in a request
	released bool          // its slot is free again
}

// refusal is what a refused connection reads: a complete response, so that
// a client (or a person with curl) learns why.
var refusal = func() []byte {
	const body = "too many connections, every one in a request; retry later\n"
	return []byte(fmt.Sprintf("HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"+
		"Connection: close\r\nRetry-After: 1\r\nContent-Length: %d\r\n\r\n%s", len(body), body))
}()

// Accept returns the next connection that gets a slot, closing idle ones to
// make room and refusing the others.
func (l *connLimiter) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if tc := l.admit(c); tc != nil {
			if tcp, ok := c.(*net.TCPConn); ok {
				_ = tcp.SetWriteBuffer(sendBuffer)
			}
			return tc, nil
		}
		l.m.shed.WithLabelValues(l.listener, shedRefused).Inc()
		// A fresh socket's send buffer is empty: this write does not wait;
		// the deadline only keeps a broken one from holding the loop.
		_ = c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
		_, _ = c.Write(refusal)
		_ = c.Close()
	}
}

// admit gives c a slot, evicting the longest-waiting connection not in a
// request if need be; nil when every slot is in a request.
func (l *connLimiter) admit(c net.Conn) *trackedConn {
	var victim *trackedConn
	l.mu.Lock()
	if l.open >= l.max {
		front := l.idle.Front()
		if front == nil {
			l.mu.Unlock()
			return nil
		}
		victim = front.Value.(*trackedConn)
		l.releaseLocked(victim)
	}
	tc := &trackedConn{Conn: c, l: l}
	tc.elem = l.idle.PushBack(tc) // not in a request until it has read one
	l.open++
	l.mu.Unlock()
	l.m.connections.WithLabelValues(l.listener).Inc()
	if victim != nil {
		l.m.shed.WithLabelValues(l.listener, shedEvicted).Inc()
		// Its server goroutine sees the error and closes it again (a no-op
		// for the slot).
		_ = victim.Conn.Close()
	}
	return tc
}

func (l *connLimiter) releaseLocked(tc *trackedConn) {
	if tc.released {
		return
	}
	tc.released = true
	if tc.elem != nil {
		l.idle.Remove(tc.elem)
		tc.elem = nil
	}
	l.open--
	l.m.connections.WithLabelValues(l.listener).Dec()
}

// closeIdle closes every connection not in a request (on shutdown, once
// the listener is closed).
func (l *connLimiter) closeIdle() {
	var idle []*trackedConn
	l.mu.Lock()
	for e := l.idle.Front(); e != nil; e = e.Next() {
		idle = append(idle, e.Value.(*trackedConn))
	}
	l.mu.Unlock()
	for _, tc := range idle {
		_ = tc.Close()
	}
}

// Close frees the connection's slot and closes it.
func (tc *trackedConn) Close() error {
	tc.l.mu.Lock()
	tc.l.releaseLocked(tc)
	tc.l.mu.Unlock()
	return tc.Conn.Close()
}

// testHookConnState, set only by tests before a server starts, sees every
// state change of a limited connection once the limiter has applied it.
var testHookConnState atomic.Pointer[func(net.Conn, http.ConnState)]

// connState is the http.Server's ConnState hook: it keeps the limiter's
// list of connections not in a request. net/http reports StateActive once
// a request's headers have been read, so a client that trickles its
// headers stays evictable.
func (l *connLimiter) connState(c net.Conn, st http.ConnState) {
	tc, ok := c.(*trackedConn)
	if !ok {
		return
	}
	if hook := testHookConnState.Load(); hook != nil {
		defer (*hook)(c, st) // after the limiter applied it
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if tc.released {
		return
	}
	switch st {
	case http.StateNew, http.StateIdle:
		if tc.elem == nil {
			tc.elem = l.idle.PushBack(tc)
		} else if st == http.StateIdle {
			l.idle.MoveToBack(tc.elem)
		}
	case http.StateActive, http.StateHijacked:
		if tc.elem != nil {
			l.idle.Remove(tc.elem)
			tc.elem = nil
		}
	case http.StateClosed:
		l.releaseLocked(tc)
	}
}
