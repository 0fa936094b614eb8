package pleg

// The errors the core caches for a pod, and how they name a pod and a
// call: the core makes them (core_pod.go, core_relist.go), the shell's
// report, logs and HTTP API read them.

import (
	"errors"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/internal/textfmt"
)

// opUnknown labels a timed-out call during which the runtime reported no
// call of its own.
const opUnknown = "unknown"

// InspectionTimeoutError is the error cached for a pod whose inspection
// exceeded the pod inspection timeout.
type InspectionTimeoutError struct {
	Pod       string // namespace/name
	UID       types.UID
	Operation string // the runtime call outstanding, e.g. "container_status"; "unknown" if none was reported
	ID        string // the container or sandbox it was about
	Waited    time.Duration
	// StillRunning is true when an earlier inspection of the pod has not
	// returned yet, so no new call was made.
	StillRunning bool
}

// Call returns the CRI method name of the outstanding call, e.g.
// "ContainerStatus".
func (e *InspectionTimeoutError) Call() string { return callName(e.Operation) }

func (e *InspectionTimeoutError) Error() string {
	call := callName(e.Operation)
	if e.ID != "" {
		call += fmt.Sprintf(" %q", e.ID)
	}
	if e.StillRunning {
		return fmt.Sprintf("inspection of pod %q still outstanding after %v (%s)", e.Pod, e.Waited, call)
	}
	return fmt.Sprintf("inspection of pod %q exceeded the pod inspection timeout of %v (%s outstanding)", e.Pod, e.Waited, call)
}

// isTimeout reports whether err is an InspectionTimeoutError.
func isTimeout(err error) bool {
	var te *InspectionTimeoutError
	return errors.As(err, &te)
}

// callName turns an operation type into the CRI method name.
func callName(op string) string {
	switch op {
	case "":
		return "no runtime call"
	case opUnknown:
		return "an unknown runtime call"
	}
	return cruntime.Method(op)
}

// podRef formats a pod as "namespace/name", the kubelet's pod= log form.
func podRef(p *cruntime.Pod) string {
	if p == nil {
		return ""
	}
	return textfmt.PodRef(p.Namespace, p.Name)
}
