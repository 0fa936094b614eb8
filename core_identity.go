package pleg

import (
	"errors"
	"maps"
	"slices"
	"strings"

	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/journal"
	"k8s.io/apimachinery/pkg/types"
)

// Containers' identities (their init PID and cgroup path, for eBPF agents):
// fetched only while some watcher wants them (identityIn), once per running
// container, with one call per pod (the pod's call out, as any other), after
// the pod's status calls and hints. What is learnt is published as an
// update of the pod (PodUpdated, for the journal only).

// onIdentityWanted turns identity fetching on or off.
func (c *core) onIdentityWanted(wanted bool) {
	c.identityWanted = wanted
	if !wanted {
		for _, uid := range c.idTodo {
			if r := c.records[uid]; r != nil {
				r.idQueued = false
				c.forget(uid)
			}
		}
		c.idTodo = nil
		return
	}
	uids := slices.Collect(maps.Keys(c.records))
	slices.SortFunc(uids, func(a, b types.UID) int { return strings.Compare(string(a), string(b)) })
	for _, uid := range uids {
		c.wantIdentities(uid, c.records[uid])
	}
}

// missingIdentities returns the running containers of r's listing whose
// identity has not been asked for yet.
func missingIdentities(r *record) []*cruntime.Container {
	if r.current == nil {
		return nil
	}
	var out []*cruntime.Container
	for _, ct := range r.current.Containers {
		if _, asked := r.identity[ct.ID]; !asked && ct.State == cruntime.StateRunning {
			out = append(out, ct)
		}
	}
	return out
}

// wantIdentities queues pod uid for an identity call if identities are
// wanted and some of its running containers lack one.
func (c *core) wantIdentities(uid types.UID, r *record) {
	if !c.identityWanted || r.idQueued || len(missingIdentities(r)) == 0 {
		return
	}
	r.idQueued = true
	c.idTodo = append(c.idTodo, uid)
}

// dispatchIdentities starts identity calls as far as slots allow, after
// everything else.
func (c *core) dispatchIdentities() {
	for len(c.idTodo) > 0 && c.active < c.cfg.slots && len(c.relist.todo) == 0 {
		uid := c.idTodo[0]
		c.idTodo = c.idTodo[1:]
		r := c.records[uid]
		if r == nil {
			continue
		}
		r.idQueued = false
		if r.call != nil {
			// Asked again once that call's outcome is applied.
			continue
		}
		missing := missingIdentities(r)
		if len(missing) == 0 {
			c.forget(uid)
			continue
		}
		c.startCall(&call{kind: callIdentity, uid: uid, pod: r.current, items: missing})
	}
	if len(c.idTodo) == 0 {
		c.idTodo = nil
	}
}

var errShortIdentities = errors.New("Identities returned a wrong number of identities")

// onIdentities steps the result of an identity call.
func (c *core) onIdentities(in identitiesFetched) {
	k, r := c.callReturned(in.call)
	if k == nil {
		return
	}
	uid := k.uid
	asked := k.items
	switch {
	case in.err != nil || len(in.ids) != len(asked):
		err := in.err
		if err == nil {
			err = errShortIdentities
		}
		c.note(note{kind: noteIdentityFailed, uid: uid, pod: k.pod, err: err})
		c.learn(r, asked, nil) // asked once: not again
	default:
		if c.learn(r, asked, in.ids) && r.current != nil && !r.needsInspection() {
			c.out.Publish = append(c.out.Publish, publication{uid: uid, pod: r.current, last: r.current, status: r.status,
				events:     []Event{{PodUID: uid, Type: journal.PodUpdated, Time: c.stepNow, PodName: r.current.Name, PodNamespace: r.current.Namespace}},
				identities: r.identity, update: true})
		}
	}
	c.inspectOwed(uid, r)
	c.afterCall(uid)
}

// learn records the identities ids of the containers asked (nil: asked,
// none given); it reports whether one was given. The record's map is
// replaced, not modified: publications share it.
func (c *core) learn(r *record, asked []*cruntime.Container, ids []*cruntime.Identity) bool {
	m := maps.Clone(r.identity)
	if m == nil {
		m = make(map[string]*cruntime.Identity, len(asked))
	}
	given := false
	for i, ct := range asked {
		var id *cruntime.Identity
		if i < len(ids) {
			id = ids[i]
		}
		m[ct.ID] = id
		given = given || id != nil
	}
	r.identity = m
	return given
}
