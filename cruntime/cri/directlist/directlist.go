// Package directlist makes a container runtime's gRPC list calls over an
// HTTP/2 connection of its own, and hands each message of a reply to a
// decoder as its bytes arrive.
//
// gRPC hands a codec a message only once all of it has arrived: on a node
// of 1,000 pods of 10 containers an unfiltered ListContainers reply is
// 8 MiB, or 4 MiB a batch when streamed, held in frame buffers while it is
// decoded. A Lister instead reads gRPC's framing itself (a 5-byte prefix
// before each message, the status in the trailers, or in the headers when
// the runtime answers at once) from a connection made by the standard
// library's HTTP/2 client (h2c on the runtime's unix socket). What is
// buffered is bounded by the stream's flow-control window (window) and one
// read buffer (readBuffer): a decoder reads an item where it lies in that
// buffer (Message), and only an item larger than it is copied.
//
// # The contract
//
// A call's outcome is the one grpc-go's client gives for the same reply,
// so that a caller sees the same whichever of the two transports it lists
// through (package cri's transport conformance test runs both against
// grpc-go servers). Errors carry a gRPC status (status.Code):
//
//   - the runtime's status, from its trailers or a trailers-only reply; a
//     malformed grpc-status is Unknown;
//   - DeadlineExceeded or Canceled once the caller's context has ended
//     (its deadline is sent as grpc-timeout), Canceled once the Lister is
//     closed;
//   - Unavailable when the connection cannot be made or is lost, at any
//     point of the call, mid-message included;
//   - a stream the runtime resets (RST_STREAM): the code grpc-go maps its
//     error code to;
//   - a reply that is not gRPC (its content type): the code its HTTP
//     status maps to as grpc-go maps it (404 Unimplemented, 503
//     Unavailable, ...), Unknown for any other, 200 included;
//   - ResourceExhausted for a message over the limit, compressed or once
//     decompressed;
//   - Internal for a reply that breaks gRPC's framing (ended inside a
//     message, a unary reply without its one message, an unknown payload
//     format) or a message the decoder rejects.
//
// A Lister asks for no compression. A message the runtime compresses
// regardless is decompressed, and held whole, with the compressor the
// process registered under its grpc-encoding (encoding.RegisterCompressor),
// as grpc-go's client does; compressed with any other it is Internal.
//
// A GOAWAY lets the calls in flight finish; the next call makes a new
// connection. The Lister sends no keepalive pings (neither does the CRI
// client's gRPC connection).
package directlist

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
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
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

const (
	// window is the flow-control window of the connection and of its
	// streams: the most the transport buffers for a listing the decoder
	// has not read yet. The decoder reads faster than a runtime encodes,
	// so the window is rarely full.
	window = 256 << 10
	// readBuffer is the decoder's read buffer: an item up to this size is
	// decoded in place.
	readBuffer = 64 << 10
	// connBuffer is the connection's read buffer.
	connBuffer = 64 << 10
)

// Lister makes calls whose replies are decoded as they arrive, over an
// HTTP/2 connection to the runtime's socket. It is safe for concurrent
// use.
type Lister struct {
	tr         *http.Transport
	maxMsgSize int
	readers    sync.Pool // *bufio.Reader of readBuffer bytes
	// done ends the calls in flight when the lister is closed, and says
	// that it is.
	done   context.Context
	cancel context.CancelFunc

	mu   sync.Mutex
	live map[*countedConn]struct{} // the connections dialed and not closed; nil once closed
}

// New returns a lister of the runtime at the unix socket path, whose
// replies' messages may be maxMsgSize bytes at most. conns, when not nil,
// moves when the lister starts reading a connection it made, and again
// when the connection is closed (by the transport, when the runtime ends
// it), as a gRPC connection's stats handler sees them begin and end.
func New(path string, maxMsgSize int, conns *atomic.Uint64) *Lister {
	if conns == nil {
		conns = &atomic.Uint64{}
	}
	var protocols http.Protocols
	protocols.SetUnencryptedHTTP2(true)
	done, cancel := context.WithCancel(context.Background())
	l := &Lister{maxMsgSize: maxMsgSize, done: done, cancel: cancel, live: map[*countedConn]struct{}{}}
	l.tr = &http.Transport{
		Protocols: &protocols,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var nd net.Dialer
			c, err := nd.DialContext(ctx, "unix", path)
			if err != nil {
				return nil, err
			}
			cc := &countedConn{Conn: c, r: bufio.NewReaderSize(c, connBuffer), conns: conns, owner: l}
			l.mu.Lock()
			defer l.mu.Unlock()
			if l.live == nil {
				c.Close()
				return nil, errClosed
			}
			l.live[cc] = struct{}{}
			return cc, nil
		},
		HTTP2: &http.HTTP2Config{
			MaxReceiveBufferPerConnection: window,
			MaxReceiveBufferPerStream:     window,
		},
		// A runtime's headers and trailers are a few hundred bytes.
		MaxResponseHeaderBytes: 64 << 10,
		DisableCompression:     true,
		MaxIdleConnsPerHost:    1,
	}
	return l
}

// countedConn moves conns once when the HTTP/2 client starts reading it,
// and again when it is closed; and reads through a buffer of its own: the
// HTTP/2 client reads its connection 4 KiB at a time, a read system call
// for every 4 KiB of a listing. A connection closed unread does not count:
// net/http dials one now and then only to drop it at once, when a request
// comes just before the connection it has is back in its pool, and that
// is no connection made or lost.
type countedConn struct {
	net.Conn
	r     *bufio.Reader // read by the transport's one read loop
	conns *atomic.Uint64
	owner *Lister
	state atomic.Int32 // connNew, connRead or connClosed
}

const (
	connNew = iota
	connRead
	connClosed
)

func (c *countedConn) Read(p []byte) (int, error) {
	if c.state.Load() == connNew && c.state.CompareAndSwap(connNew, connRead) {
		c.conns.Add(1)
	}
	return c.r.Read(p)
}

func (c *countedConn) Close() error {
	if was := c.state.Swap(connClosed); was != connClosed {
		if was == connRead {
			c.conns.Add(1)
		}
		c.owner.mu.Lock()
		delete(c.owner.live, c)
		c.owner.mu.Unlock()
	}
	return c.Conn.Close()
}

// Close ends the calls in flight (Canceled) and closes the connections;
// later calls fail.
func (l *Lister) Close() {
	l.cancel()
	l.mu.Lock()
	live := l.live
	l.live = nil
	l.mu.Unlock()
	for c := range live {
		c.Close()
	}
	l.tr.CloseIdleConnections()
}

// errClosed is a call on a closed lister.
var errClosed = status.Error(codes.Canceled, "the CRI client is closed")

// errNoMessage is a unary reply without its message.
var errNoMessage = errors.New("the runtime ended the reply without a message")

// Call makes the gRPC call method (its full name) with req, and hands
// each message of the reply to decode as it arrives, through a reader
// bounded by the message. unary says the reply must be exactly one
// message. It returns how many messages were decoded, and an error with a
// gRPC status (see the package's contract).
func (l *Lister) Call(ctx context.Context, method string, req proto.Message, unary bool, decode func(*Message) error) (int, error) {
	if l.done.Err() != nil {
		return 0, errClosed
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(l.done, cancel)()
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
	// Exactly application/grpc: CRI-O's cmux matches that string.
	hreq.Header["Content-Type"] = []string{"application/grpc"}
	hreq.Header["Te"] = []string{"trailers"}
	hreq.Header["User-Agent"] = []string{"pleg-cri-list"}
	if dl, ok := ctx.Deadline(); ok {
		hreq.Header["Grpc-Timeout"] = []string{encodeTimeout(time.Until(dl))}
	}
	resp, err := l.tr.RoundTrip(hreq)
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

	rb := bodyReader{resp.Body}
	br, _ := l.readers.Get().(*bufio.Reader)
	if br == nil {
		br = bufio.NewReaderSize(rb, readBuffer)
	} else {
		br.Reset(rb)
	}
	defer func() {
		br.Reset(nil)
		l.readers.Put(br)
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
		size := binary.BigEndian.Uint32(prefix[1:])
		if uint64(size) > uint64(l.maxMsgSize) {
			return n, status.Errorf(codes.ResourceExhausted, "%s: received message larger than max (%d vs. %d)", method, size, l.maxMsgSize)
		}
		if unary && n > 0 {
			return n, status.Errorf(codes.Internal, "%s: a unary reply of more than one message", method)
		}
		m := &Message{br: br, rest: int(size)}
		switch prefix[0] {
		case 0:
		case 1:
			if m, err = l.decompress(ctx, method, resp.Header.Get("Grpc-Encoding"), br, int(size)); err != nil {
				return n, err
			}
		default:
			return n, status.Errorf(codes.Internal, "%s: a message of unknown payload format %d", method, prefix[0])
		}
		err := decode(m)
		if m.err != nil {
			return n, readStatus(ctx, m.err)
		}
		if err != nil {
			return n, status.Errorf(codes.Internal, "%s: decoding message %d of the reply: %v", method, n+1, err)
		}
		if !m.Skip(m.rest) { // what decode left of the message
			return n, readStatus(ctx, m.err)
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

// decompress reads the compressed message of size bytes next in br and
// returns a reader of it decompressed, held whole (at most maxMsgSize
// bytes) as gRPC holds it, decompressed with the compressor the process
// registered under enc (encoding.RegisterCompressor).
func (l *Lister) decompress(ctx context.Context, method, enc string, br *bufio.Reader, size int) (*Message, error) {
	if enc == "" || enc == "identity" {
		return nil, status.Errorf(codes.Internal, "%s: a compressed message without its encoding", method)
	}
	comp := encoding.GetCompressor(enc)
	if comp == nil {
		return nil, status.Errorf(codes.Internal, "%s: a message compressed with %q, which this program has no decompressor for", method, enc)
	}
	b := make([]byte, size)
	if _, err := io.ReadFull(br, b); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, readStatus(ctx, err)
	}
	r, err := comp.Decompress(bytes.NewReader(b))
	if err == nil {
		b, err = io.ReadAll(io.LimitReader(r, int64(l.maxMsgSize)+1))
	}
	if err != nil {
		return nil, status.Errorf(codes.Internal, "%s: decompressing a message with %q: %v", method, enc, err)
	}
	if len(b) > l.maxMsgSize {
		return nil, status.Errorf(codes.ResourceExhausted, "%s: received message after decompression larger than max %d", method, l.maxMsgSize)
	}
	return &Message{br: bufio.NewReaderSize(bytes.NewReader(b), min(max(len(b), 16), readBuffer)), rest: len(b)}, nil
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

// transportStatus is the status of a call whose stream failed, before its
// reply's headers came or while its body was read: ctx's end; else the
// code the runtime reset the stream with, as grpc-go maps it; else a
// connection that could not be made or was lost (Unavailable, as gRPC
// says).
func transportStatus(ctx context.Context, err error) error {
	if err := ended(ctx); err != nil {
		return err
	}
	var se h2StreamError
	if errors.As(err, &se) {
		code, ok := resetCodes[se.Code]
		if !ok {
			code = codes.Unknown
		}
		return status.Errorf(code, "stream terminated by RST_STREAM with error code %d: %v", se.Code, err)
	}
	return status.Error(codes.Unavailable, err.Error())
}

// h2StreamError matches (errors.As) net/http's HTTP/2 stream errors, a
// RST_STREAM frame's among them: they match any struct of their fields'
// names and types, as golang.org/x/net/http2.StreamError.
type h2StreamError struct {
	StreamID uint32
	Code     uint32
	Cause    error
}

func (e h2StreamError) Error() string {
	return fmt.Sprintf("stream %d reset with code %d", e.StreamID, e.Code)
}

// resetCodes are the codes of RST_STREAM frames (RFC 9113, 7) as grpc-go
// maps them.
var resetCodes = map[uint32]codes.Code{
	0x0: codes.Internal,          // NO_ERROR
	0x1: codes.Internal,          // PROTOCOL_ERROR
	0x2: codes.Internal,          // INTERNAL_ERROR
	0x3: codes.ResourceExhausted, // FLOW_CONTROL_ERROR
	0x4: codes.Internal,          // SETTINGS_TIMEOUT
	0x5: codes.Internal,          // STREAM_CLOSED
	0x6: codes.Internal,          // FRAME_SIZE_ERROR
	0x7: codes.Unavailable,       // REFUSED_STREAM
	0x8: codes.Canceled,          // CANCEL
	0x9: codes.Internal,          // COMPRESSION_ERROR
	0xa: codes.Internal,          // CONNECT_ERROR
	0xb: codes.ResourceExhausted, // ENHANCE_YOUR_CALM
	0xc: codes.PermissionDenied,  // INADEQUATE_SECURITY
	0xd: codes.Internal,          // HTTP_1_1_REQUIRED
}

// bodyReader reads a reply's body. Its reads fail with a *streamFailure
// when the stream or the connection fails, and with io.EOF only at the
// body's end: the two otherwise look alike (the HTTP/2 client reports a
// connection lost as io.ErrUnexpectedEOF), and are two statuses.
type bodyReader struct{ r io.Reader }

func (b bodyReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil && err != io.EOF {
		err = &streamFailure{err}
	}
	return n, err
}

// streamFailure is a body read that failed.
type streamFailure struct{ err error }

func (e *streamFailure) Error() string { return e.err.Error() }
func (e *streamFailure) Unwrap() error { return e.err }

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
	if sf := (*streamFailure)(nil); errors.As(err, &sf) {
		return transportStatus(ctx, sf.err)
	}
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return status.Error(codes.Internal, "the reply ended inside a message")
	}
	return status.Error(codes.Unavailable, err.Error())
}

// responseStatus checks the reply's headers as grpc-go's client does: a
// reply of gRPC's content type is read whatever its HTTP status; any other
// is an error whose code the HTTP status gives, Unknown for one without
// a gRPC meaning (200 among them).
func responseStatus(resp *http.Response) error {
	ct := resp.Header.Get("Content-Type")
	if ct == "application/grpc" || strings.HasPrefix(ct, "application/grpc+") || strings.HasPrefix(ct, "application/grpc;") {
		return nil
	}
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
	return status.Errorf(code, "the runtime answered HTTP status %d with content type %q, not gRPC", resp.StatusCode, ct)
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
		return status.Errorf(codes.Unknown, "a malformed grpc-status %.32q", v[0])
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
