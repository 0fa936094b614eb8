package directlist

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"

	"google.golang.org/protobuf/encoding/protowire"
)

// Message is one message of a reply, read as it arrives: Left bytes from a
// buffered reader. A read that fails reports failure (false) and keeps
// its error in Err; the call then fails with the error's status, whatever
// the decoder returns.
type Message struct {
	br   *bufio.Reader
	rest int
	err  error
}

// NewMessage returns a reader of the next size bytes of br as a message
// (for decoders' tests: a Lister makes its own).
func NewMessage(br *bufio.Reader, size int) *Message {
	return &Message{br: br, rest: size}
}

// Done reports whether the message has no bytes left.
func (m *Message) Done() bool { return m.rest == 0 }

// Left is how many bytes the message has left.
func (m *Message) Left() int { return m.rest }

// Err is the error of the read that failed, if one did; a body that ended
// inside the message is io.ErrUnexpectedEOF.
func (m *Message) Err() error { return m.err }

func (m *Message) fail(err error) {
	if m.err == nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF // the message said it had more
		}
		m.err = err
	}
}

// Varint reads a varint.
func (m *Message) Varint() (uint64, bool) {
	if m.rest == 0 {
		return 0, false
	}
	b, err := m.br.Peek(min(m.rest, binary.MaxVarintLen64))
	if x, n := protowire.ConsumeVarint(b); n > 0 {
		m.br.Discard(n) // buffered: cannot fail
		m.rest -= n
		return x, true
	}
	if err != nil {
		m.fail(err)
	}
	return 0, false
}

// Skip moves past n bytes.
func (m *Message) Skip(n int) bool {
	if n > m.rest {
		return false
	}
	k, err := m.br.Discard(n)
	m.rest -= k
	if err != nil {
		m.fail(err)
		return false
	}
	return true
}

// Bytes returns the next n bytes (n <= Left()): a view of the read buffer,
// valid until the next read, when they fit in it; else a copy in
// *scratch.
func (m *Message) Bytes(n int, scratch *[]byte) ([]byte, bool) {
	if n > m.rest {
		return nil, false
	}
	if n <= m.br.Size() {
		b, err := m.br.Peek(n)
		if err != nil {
			m.fail(err)
			return nil, false
		}
		m.br.Discard(n) // buffered: the view stays valid until the next read
		m.rest -= n
		return b[:n:n], true
	}
	if cap(*scratch) < n {
		*scratch = make([]byte, n)
	}
	out := (*scratch)[:n]
	k, err := io.ReadFull(m.br, out)
	m.rest -= k
	if err != nil {
		m.fail(err)
		return nil, false
	}
	return out, true
}
