package journal

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/podlifecycle/pleg/internal/textfmt"
)

// Filter selects pods and events. A nil Filter selects everything.
type Filter struct {
	namespaces []string
	selector   labels.Selector // nil: any labels
	uids       []types.UID
	types      []string
	identity   bool
}

// FilterSpec is a filter as a client gives it.
type FilterSpec struct {
	Namespaces    []string
	LabelSelector string
	PodUIDs       []string
	// EventTypes: transition types (ContainerStarted, ContainerDied,
	// ContainerRemoved, PodSync, PodUpdated).
	EventTypes []string
	// Identity: the watcher asked for containers' identities. Without it,
	// the events that only fill identities in (PodUpdated alone) are
	// skipped.
	Identity bool
}

// EventTypes are the transition types a filter takes.
var EventTypes = []string{"ContainerStarted", "ContainerDied", "ContainerRemoved", "PodSync", PodUpdated}

// FilterError is a filter that is not one; Field names the bad part.
type FilterError struct {
	Field  string // "namespaces", "labelSelector", "podUIDs" or "eventTypes"
	Value  string
	Reason string
}

func (e *FilterError) Error() string {
	return fmt.Sprintf("invalid filter: %s %s: %s", e.Field, textfmt.Echo(e.Value), e.Reason)
}

// NewFilter checks s and returns its filter.
func NewFilter(s FilterSpec) (*Filter, error) {
	f := &Filter{}
	for _, ns := range s.Namespaces {
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			return nil, &FilterError{Field: "namespaces", Value: ns, Reason: textfmt.Bound(strings.Join(errs, "; "), textfmt.ReasonMax)}
		}
		f.namespaces = append(f.namespaces, ns)
	}
	if strings.TrimSpace(s.LabelSelector) != "" {
		sel, err := labels.Parse(s.LabelSelector)
		if err != nil {
			return nil, &FilterError{Field: "labelSelector", Value: s.LabelSelector, Reason: textfmt.Bound(err.Error(), textfmt.ReasonMax)}
		}
		f.selector = sel
	}
	for _, uid := range s.PodUIDs {
		if strings.TrimSpace(uid) == "" {
			return nil, &FilterError{Field: "podUIDs", Value: uid, Reason: "empty UID"}
		}
		f.uids = append(f.uids, types.UID(uid))
	}
	for _, t := range s.EventTypes {
		if !slices.Contains(EventTypes, t) {
			return nil, &FilterError{Field: "eventTypes", Value: t, Reason: "want one of " + strings.Join(EventTypes, ", ")}
		}
		f.types = append(f.types, t)
	}
	f.identity = s.Identity
	return f, nil
}

// matchPod reports whether f selects pod p.
func (f *Filter) matchPod(p *Pod) bool {
	if f == nil {
		return true
	}
	if len(f.namespaces) > 0 && !slices.Contains(f.namespaces, p.Namespace) {
		return false
	}
	if len(f.uids) > 0 && !slices.Contains(f.uids, p.UID) {
		return false
	}
	return f.selector == nil || f.selector.Matches(p.Labels)
}

// matchEntry reports whether f selects entry e: runtime status always;
// a pod change if its pod passes and, with event types, one of its
// transitions has one of them; an identity update only if asked for.
func (f *Filter) matchEntry(e *Entry) bool {
	if e.Kind == KindRuntime {
		return true
	}
	if (f == nil || !f.identity) && len(e.Transitions) == 1 && e.Transitions[0].Type == PodUpdated {
		return false
	}
	if f == nil {
		return true
	}
	if !f.matchPod(e.Pod) {
		return false
	}
	if len(f.types) == 0 {
		return true
	}
	for _, t := range e.Transitions {
		if slices.Contains(f.types, t.Type) {
			return true
		}
	}
	return false
}
