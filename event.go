package pleg

import (
	"encoding/json"
	"github.com/podlifecycle/pleg/internal/textfmt"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// EventType is the type of a pod lifecycle event. The values are the
// kubelet's.
type EventType string

const (
	// ContainerStarted: a container or sandbox is now running.
	ContainerStarted EventType = "ContainerStarted"
	// ContainerDied: a container or sandbox is no longer running.
	ContainerDied EventType = "ContainerDied"
	// ContainerRemoved: a container or sandbox no longer exists.
	ContainerRemoved EventType = "ContainerRemoved"
	// PodSync: the pod was reinspected although no container changed.
	PodSync EventType = "PodSync"
	// ContainerChanged: a container moved to an unknown state. Computed
	// (it marks the pod changed) but never delivered, as in the kubelet.
	ContainerChanged EventType = "ContainerChanged"
)

// Event is one pod lifecycle event.
type Event struct {
	// Time is when the event was delivered.
	Time         time.Time
	Type         EventType
	PodUID       types.UID
	PodName      string
	PodNamespace string
	// ContainerID is the container or sandbox the event is about; empty
	// for PodSync. Sandboxes are treated exactly like containers.
	ContainerID   string
	ContainerName string
	// Sandbox is true when ContainerID is a pod sandbox.
	Sandbox bool
	// ExitCode is set on ContainerDied when the fresh status knows it.
	ExitCode *int32
}

// eventJSON is the wire form of an Event: `pleg watch --output json` and
// the daemon's event stream print exactly these keys.
type eventJSON struct {
	Time          string    `json:"time"`
	Type          EventType `json:"type"`
	PodUID        types.UID `json:"podUID"`
	PodName       string    `json:"podName"`
	PodNamespace  string    `json:"podNamespace"`
	ContainerID   *string   `json:"containerID,omitempty"`
	ContainerName string    `json:"containerName,omitempty"`
	ExitCode      *int32    `json:"exitCode,omitempty"`
}

// MarshalJSON encodes the event with the keys time (RFC 3339 with
// nanoseconds), type, podUID, podName, podNamespace, containerID (absent for
// PodSync), and containerName and exitCode when known.
func (e Event) MarshalJSON() ([]byte, error) {
	j := eventJSON{
		Time:          e.Time.UTC().Format(time.RFC3339Nano),
		Type:          e.Type,
		PodUID:        e.PodUID,
		PodName:       e.PodName,
		PodNamespace:  e.PodNamespace,
		ContainerName: e.ContainerName,
		ExitCode:      e.ExitCode,
	}
	if e.Type != PodSync {
		id := e.ContainerID
		j.ContainerID = &id
	}
	return json.Marshal(j)
}

// UnmarshalJSON decodes the form written by MarshalJSON.
func (e *Event) UnmarshalJSON(b []byte) error {
	var j eventJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	t, err := time.Parse(time.RFC3339Nano, j.Time)
	if err != nil && j.Time != "" {
		return err
	}
	*e = Event{Time: t, Type: j.Type, PodUID: j.PodUID, PodName: j.PodName,
		PodNamespace: j.PodNamespace, ContainerName: j.ContainerName, ExitCode: j.ExitCode}
	if j.ContainerID != nil {
		e.ContainerID = *j.ContainerID
	}
	return nil
}

// Pod returns "namespace/name", the form the kubelet logs pods in.
func (e Event) Pod() string { return textfmt.PodRef(e.PodNamespace, e.PodName) }
