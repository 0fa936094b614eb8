package cri

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// EndpointError is the error of Dial for an endpoint it cannot use.
type EndpointError struct {
	Endpoint string
	Reason   string // what is wrong with it, e.g. "no socket path; want unix:///absolute/path/to/socket"
}

func (e *EndpointError) Error() string {
	if e.Endpoint == "" {
		return "runtime endpoint is empty; " + e.Reason
	}
	return fmt.Sprintf("runtime endpoint %q: %s", e.Endpoint, e.Reason)
}

// CallError is the error of one CRI call: the method, the container or
// sandbox ID it was about (may be empty), the endpoint, and the gRPC status
// code. It wraps the gRPC error, so status.Code and status.FromError still
// see the status; a DeadlineExceeded or Canceled status also matches
// context.DeadlineExceeded or context.Canceled under errors.Is.
type CallError struct {
	Method   string
	ID       string
	Endpoint string
	Code     codes.Code
	// Unreachable says why the socket could not be connected to, when
	// the call failed as Unavailable and a dial of the socket fails too:
	// e.g. "dial unix /run/x.sock: connect: no such file or directory".
	Unreachable error
	Err         error
}

func (e *CallError) Error() string {
	if e.ID == "" {
		return e.Method + ": " + e.Err.Error()
	}
	return fmt.Sprintf("%s %q: %v", e.Method, e.ID, e.Err)
}

func (e *CallError) Unwrap() error { return e.Err }

// RuntimeCall returns the CRI method that failed and the sandbox or
// container it was about.
func (e *CallError) RuntimeCall() (method, id string) { return e.Method, e.ID }

func (e *CallError) Is(target error) bool {
	switch e.Code {
	case codes.DeadlineExceeded:
		return target == context.DeadlineExceeded
	case codes.Canceled:
		return target == context.Canceled
	}
	return false
}

// Cause says in a few words what went wrong, without gRPC's wrapping: why
// the socket is unreachable, or the status code and the runtime's message.
func (e *CallError) Cause() string {
	if e.Unreachable != nil {
		return e.Unreachable.Error()
	}
	if st, ok := status.FromError(e.Err); ok {
		return e.Code.String() + ": " + st.Message()
	}
	return e.Err.Error()
}

// newCallError wraps the error of a call to the runtime at endpoint,
// through its socket at path.
func newCallError(method, id, endpoint, path string, err error) *CallError {
	ce := &CallError{Method: method, ID: id, Endpoint: endpoint, Code: status.Code(err), Err: err}
	if ce.Code == codes.Unavailable && path != "" {
		// gRPC reports a failed dial as text inside the status; dial the
		// socket ourselves for the typed reason.
		if c, derr := net.DialTimeout("unix", path, time.Second); derr != nil {
			ce.Unreachable = derr
		} else {
			c.Close()
		}
	}
	return ce
}

// Cause describes err, the error of a Client call, in a few words: a
// CallError's Cause, else the error itself.
func Cause(err error) string {
	var ce *CallError
	if errors.As(err, &ce) {
		return ce.Cause()
	}
	return err.Error()
}
