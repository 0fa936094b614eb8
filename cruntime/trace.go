package cruntime

import (
	"context"
	"time"

	"github.com/podlifecycle/pleg/internal/op"
)

// CallTracer observes the runtime calls made on behalf of one context. The
// generator uses it to name the call a slow pod is stuck in; `pleg diagnose`
// uses it to time every call.
type CallTracer interface {
	// StartCall is called before a runtime call; op is the operation
	// type (OpContainerStatus...) and id the container or
	// sandbox ID, if any. The returned function is called once with the
	// call's duration and error when the call returns.
	StartCall(op, id string) (done func(d time.Duration, err error))
}

type tracerKey struct{}

// WithCallTracer returns a context whose runtime calls are reported to t.
func WithCallTracer(ctx context.Context, t CallTracer) context.Context {
	return context.WithValue(ctx, tracerKey{}, t)
}

// CallTracerFrom returns the tracer of ctx, or nil.
func CallTracerFrom(ctx context.Context) CallTracer {
	t, _ := ctx.Value(tracerKey{}).(CallTracer)
	return t
}

// Runtime operation types: the op a CallTracer is told, and the values of
// the operation_type label of pleg's metrics (defined in internal/op).
const (
	OpListPodSandbox     = op.ListPodSandbox
	OpListContainers     = op.ListContainers
	OpPodSandboxStatus   = op.PodSandboxStatus
	OpContainerStatus    = op.ContainerStatus
	OpGetContainerEvents = op.GetContainerEvents
	OpStatus             = op.Status
	OpVersion            = op.Version
)

// Method returns the CRI method of an operation type (the operation_type
// label), e.g. "ContainerStatus" for "container_status"; an unknown
// operation type is returned as is.
func Method(o string) string { return op.Method(o) }
