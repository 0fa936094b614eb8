package cri

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// Direct listings. gRPC hands a codec a message only once all of it has
// arrived: on a node of 1,000 pods of 10 containers an unfiltered
// ListContainers reply is 8 MiB, or 4 MiB a batch when streamed, held in
// frame buffers while it is decoded, the biggest thing pleg keeps in
// memory. So the relist's two unfiltered listings (unary or streamed) go
// over an HTTP/2 connection of their own, made by the standard library's
// client, and are decoded as their bytes arrive: this file reads gRPC's
// framing (a 5-byte prefix before each message, the status in the
// trailers, or in the headers when the runtime answers at once). What is
// buffered is bounded by the stream's flow-control window (directWindow)
// and one read buffer (directReadBuffer); an item is decoded where it lies
// in that buffer, and only an item larger than it is copied. Every other
// call, filtered listings included, goes through the client's gRPC
// connection. WithDirectLists(false) lists through gRPC too.

const (
	// directWindow is the flow-control window of the direct connection
	// and of its streams: the most the transport buffers for a listing
	// the decoder has not read yet. The decoder reads faster than a
	// runtime encodes, so the window is rarely full.
	directWindow = 256 << 10
	// directReadBuffer is the decoder's read buffer: an item up to this
	// size is decoded in place.
	directReadBuffer = 64 << 10
	// directConnBuffer is the connection's read buffer.
	directConnBuffer = 64 << 10
)

// WithDirectLists sets whether the relist's unfiltered listings are read
// from a connection of their own and decoded as they arrive (true, the
// default) or through the client's gRPC connection, which holds each reply
// (or each streamed batch) whole in memory before decoding it. The calls
// the runtime serves, and the items decoded, are the same either way.
func WithDirectLists(on bool) Option {
	return func(o *options) { o.grpcLists = !on }
}

// directLister makes calls whose replies are decoded as they arrive, over
// an HTTP/2 connection to the runtime's socket (h2c, the client's own).
type directLister struct {
	tr      *http.Transport
	readers sync.Pool // *bufio.Reader of directReadBuffer bytes
	// done ends the calls in flight when the lister is closed, and
	// says that it is.
	done   context.Context
	cancel context.CancelFunc

	mu   sync.Mutex
	live map[*countedConn]struct{} // the connections dialed and not closed; nil once closed
}

// newDirectLister returns a lister of the runtime at the unix socket path.
// Each connection it makes moves conns, and again when it is closed (by
// the transport, when the runtime ends it), as the gRPC connection's do.
func newDirectLister(path string, conns *atomic.Uint64) *directLister {
	var protocols http.Protocols
	protocols.SetUnencryptedHTTP2(true)
	done, cancel := context.WithCancel(context.Background())
	d := &directLister{done: done, cancel: cancel, live: map[*countedConn]struct{}{}}
	d.tr = &http.Transport{
		Protocols: &protocols,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var nd net.Dialer
			c, err := nd.DialContext(ctx, "unix", path)
			if err != nil {
				return nil, err
			}
			cc := &countedConn{Conn: c, r: bufio.NewReaderSize(c, directConnBuffer), conns: conns, owner: d}
			d.mu.Lock()
			defer d.mu.Unlock()
			if d.live == nil {
				c.Close()
				return nil, errClosed
			}
			d.live[cc] = struct{}{}
			conns.Add(1)
			return cc, nil
		},
		HTTP2: &http.HTTP2Config{
			MaxReceiveBufferPerConnection: directWindow,
			MaxReceiveBufferPerStream:     directWindow,
		},
		// A runtime's headers and trailers are a few hundred bytes.
		MaxResponseHeaderBytes: 64 << 10,
		DisableCompression:     true,
		MaxIdleConnsPerHost:    1,
	}
	return d
}

// countedConn moves conns once when it is closed, and reads through a
// buffer of its own: the HTTP/2 client reads its connection 4 KiB at a
// time, a read system call for every 4 KiB of a listing.
type countedConn struct {
	net.Conn
	r      *bufio.Reader // read by the transport's one read loop
	conns  *atomic.Uint64
	owner  *directLister
	closed atomic.Bool
}

func (c *countedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

func (c *countedConn) Close() error {
	if !c.closed.Swap(true) {
		c.conns.Add(1)
		c.owner.mu.Lock()
		delete(c.owner.live, c)
		c.owner.mu.Unlock()
	}
	return c.Conn.Close()
}

// close ends the calls in flight (Canceled) and closes the connections;
// later calls fail.
func (d *directLister) close() {
	d.cancel()
	d.mu.Lock()
	live := d.live
	d.live = nil
	d.mu.Unlock()
	for c := range live {
		c.Close()
	}
	d.tr.CloseIdleConnections()
}

// errClosed is a call on a closed client.
var errClosed = status.Error(codes.Canceled, "the CRI client is closed")

// errNoMessage is a unary reply without its message.
var errNoMessage = errors.New("the runtime ended the reply without a message")

// call makes the gRPC call method with req, and hands each message of the
// reply to decode as it arrives, through a reader bounded by the message.
// unary says the reply must be exactly one message. It returns how many
// messages were decoded, and an error with a gRPC status, as gRPC's own
// calls do: the runtime's status, Unavailable when the connection failed,
// DeadlineExceeded or Canceled when ctx ended, ResourceExhausted for a
// message over maxMsgSize, Internal for a reply that breaks the protocol
// or a message decode rejects.
func (d *directLister) call(ctx context.Context, method string, req proto.Message, unary bool, decode func(*streamReader) error) (int, error) {
	if d.done.Err() != nil {
		return 0, errClosed
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(d.done, cancel)()
	if err := ended(ctx); err != nil {
		return 0, err
	}
	body, err := requestBody(req)
	if err != nil {
		return 0, status.Errorf(codes.Internal, "encoding the request: %v", err)
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://localhost"+method, bytes.NewReader(body))
	if err != nil {
		return 0, status.Errorf(codes.Internal, "request for %s: %v", method, err)
	}
	// Exactly application/grpc: CRI-O's cmux matches that string (see
	// leanCodec.Name).
	hreq.Header["Content-Type"] = []string{"application/grpc"}
	hreq.Header["Te"] = []string{"trailers"}
	hreq.Header["User-Agent"] = []string{"pleg-cri-list"}
	if dl, ok := ctx.Deadline(); ok {
		hreq.Header["Grpc-Timeout"] = []string{encodeTimeout(time.Until(dl))}
	}
	resp, err := d.tr.RoundTrip(hreq)
	if err != nil {
		return 0, transportStatus(ctx, err)
	}
	defer resp.Body.Close() // before the end: resets the stream
	if err := responseStatus(resp); err != nil {
		return 0, readStatus(ctx, err)
	}
	if _, ok := resp.Header["Grpc-Status"]; ok {
		// Trailers only: the runtime's status, and no message.
		if err := trailerStatus(resp.Header); err != nil || !unary {
			return 0, err
		}
		return 0, status.Errorf(codes.Internal, "%s: %v", method, errNoMessage)
	}

	br, _ := d.readers.Get().(*bufio.Reader)
	if br == nil {
		br = bufio.NewReaderSize(resp.Body, directReadBuffer)
	} else {
		br.Reset(resp.Body)
	}
	defer func() {
		br.Reset(nil)
		d.readers.Put(br)
	}()

	n := 0
	for ; ; n++ {
		var prefix [5]byte
		if _, err := io.ReadFull(br, prefix[:]); err != nil {
			if errors.Is(err, io.EOF) {
				break // the reply's end, between two messages
			}
			return n, readStatus(ctx, err)
		}
		if prefix[0] != 0 {
			return n, status.Errorf(codes.Internal, "%s: a compressed message (flag %d), and no compression was asked for", method, prefix[0])
		}
		size := binary.BigEndian.Uint32(prefix[1:])
		if size > maxMsgSize {
			return n, status.Errorf(codes.ResourceExhausted, "%s: received message larger than max (%d vs. %d)", method, size, maxMsgSize)
		}
		if unary && n > 0 {
			return n, status.Errorf(codes.Internal, "%s: a unary reply of more than one message", method)
		}
		sr := streamReader{br: br, rest: int(size)}
		err := decode(&sr)
		if sr.err != nil {
			return n, readStatus(ctx, sr.err)
		}
		if err != nil {
			return n, status.Errorf(codes.Internal, "%s: decoding message %d of the reply: %v", method, n+1, err)
		}
		if !sr.skip(sr.rest) { // what decode left of the message
			return n, readStatus(ctx, sr.err)
		}
	}
	if err := trailerStatus(resp.Trailer); err != nil {
		return n, err
	}
	if unary && n == 0 {
		return n, status.Errorf(codes.Internal, "%s: %v", method, errNoMessage)
	}
	return n, nil
}

// requestBody is req as one gRPC message: the uncompressed flag, the
// length, the bytes.
func requestBody(req proto.Message) ([]byte, error) {
	b := make([]byte, 5, 5+proto.Size(req))
	b, err := proto.MarshalOptions{}.MarshalAppend(b, req)
	if err != nil {
		return nil, err
	}
	binary.BigEndian.PutUint32(b[1:5], uint32(len(b)-5))
	return b, nil
}

// encodeTimeout writes d as a grpc-timeout header value: at most eight
// digits and a unit, rounded up.
func encodeTimeout(d time.Duration) string {
	if d <= 0 {
		return "1n"
	}
	for _, u := range []struct {
		unit string
		d    time.Duration
	}{{"n", time.Nanosecond}, {"u", time.Microsecond}, {"m", time.Millisecond}, {"S", time.Second}, {"M", time.Minute}} {
		if v := (d + u.d - 1) / u.d; v <= 99_999_999 {
			return strconv.FormatInt(int64(v), 10) + u.unit
		}
	}
	return strconv.FormatInt(int64((d+time.Hour-1)/time.Hour), 10) + "H"
}

// transportStatus is the status of a call that failed before its reply's
// headers came: ctx's end, else a connection that could not be made or
// was lost (Unavailable, as gRPC says).
func transportStatus(ctx context.Context, err error) error {
	if err := ended(ctx); err != nil {
		return err
	}
	return status.Error(codes.Unavailable, err.Error())
}

// ended is the status of a call whose context has ended, or is past its
// deadline: the runtime, which got the deadline as grpc-timeout, may
// reset the stream at it a moment before the context's own timer fires.
// Nil while the context is live.
func ended(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return status.FromContextError(err).Err()
	}
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
		return status.FromContextError(context.DeadlineExceeded).Err()
	}
	return nil
}

// readStatus is the status of a reply whose body could not be read to its
// end.
func readStatus(ctx context.Context, err error) error {
	if err := ended(ctx); err != nil {
		return err
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return status.Error(codes.Internal, "the reply ended inside a message")
	}
	return status.Error(codes.Unavailable, err.Error())
}

// responseStatus checks the reply's headers: an HTTP status other than 200
// is mapped as gRPC maps it, and the content type must be gRPC's.
func responseStatus(resp *http.Response) error {
	if resp.StatusCode != http.StatusOK {
		code := codes.Unknown
		switch resp.StatusCode {
		case http.StatusBadRequest:
			code = codes.Internal
		case http.StatusUnauthorized:
			code = codes.Unauthenticated
		case http.StatusForbidden:
			code = codes.PermissionDenied
		case http.StatusNotFound:
			code = codes.Unimplemented
		case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
			code = codes.Unavailable
		}
		return status.Errorf(code, "unexpected HTTP status %d from the runtime", resp.StatusCode)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/grpc" && !strings.HasPrefix(ct, "application/grpc+") && !strings.HasPrefix(ct, "application/grpc;") {
		return status.Errorf(codes.Internal, "the runtime answered with content type %q, not gRPC", ct)
	}
	return nil
}

// trailerStatus is the status a reply's trailers (or trailers-only
// headers) carry: nil for OK.
func trailerStatus(h http.Header) error {
	v, ok := h["Grpc-Status"]
	if !ok || len(v) == 0 {
		return status.Error(codes.Internal, "the runtime ended the reply without a gRPC status")
	}
	n, err := strconv.ParseUint(v[0], 10, 32)
	if err != nil {
		return status.Errorf(codes.Internal, "a malformed grpc-status %.32q", v[0])
	}
	if n == 0 {
		return nil
	}
	msg := h.Get("Grpc-Message")
	if m, err := url.PathUnescape(msg); err == nil {
		msg = m
	}
	return status.Error(codes.Code(n), msg)
}

// streamReader reads one message of a reply as it arrives: rest bytes
// from br. An I/O error is kept in err, and the read reports failure.
type streamReader struct {
	br   *bufio.Reader
	rest int
	err  error
}

func (s *streamReader) done() bool { return s.rest == 0 }

func (s *streamReader) left() int { return s.rest }

func (s *streamReader) fail(err error) {
	if s.err == nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF // the message said it had more
		}
		s.err = err
	}
}

func (s *streamReader) varint() (uint64, bool) {
	if s.rest == 0 {
		return 0, false
	}
	b, err := s.br.Peek(min(s.rest, binary.MaxVarintLen64))
	if x, n := protowire.ConsumeVarint(b); n > 0 {
		s.br.Discard(n) // buffered: cannot fail
		s.rest -= n
		return x, true
	}
	if err != nil {
		s.fail(err)
	}
	return 0, false
}

func (s *streamReader) skip(n int) bool {
	if n > s.rest {
		return false
	}
	k, err := s.br.Discard(n)
	s.rest -= k
	if err != nil {
		s.fail(err)
		return false
	}
	return true
}

func (s *streamReader) bytes(n int, scratch *[]byte) ([]byte, bool) {
	if n > s.rest {
		return nil, false
	}
	if n <= s.br.Size() {
		b, err := s.br.Peek(n)
		if err != nil {
			s.fail(err)
			return nil, false
		}
		s.br.Discard(n) // buffered: the view stays valid until the next read
		s.rest -= n
		return b[:n:n], true
	}
	if cap(*scratch) < n {
		*scratch = make([]byte, n)
	}
	out := (*scratch)[:n]
	k, err := io.ReadFull(s.br, out)
	s.rest -= k
	if err != nil {
		s.fail(err)
		return nil, false
	}
	return out, true
}
