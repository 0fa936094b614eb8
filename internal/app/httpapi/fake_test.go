package httpapi

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/podlifecycle/pleg"
	"github.com/podlifecycle/pleg/cruntime"
)

// fakeRuntime is an in-memory runtime: pods as listed, statuses derived
// from the listing (exit code and IPs from the maps).
type fakeRuntime struct {
	mu        sync.Mutex
	pods      []*cruntime.Pod
	exitCodes map[string]int32
	ips       map[types.UID][]string
	fail      map[types.UID]error
}

func newFakeRuntime() *fakeRuntime {
	return &fakeRuntime{exitCodes: map[string]int32{}, ips: map[types.UID][]string{}, fail: map[types.UID]error{}}
}

func (f *fakeRuntime) set(mut func(f *fakeRuntime)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	mut(f)
}

func clonePod(p *cruntime.Pod) *cruntime.Pod {
	q := *p
	q.Sandboxes, q.Containers = nil, nil
	for _, s := range p.Sandboxes {
		c := *s
		q.Sandboxes = append(q.Sandboxes, &c)
	}
	for _, s := range p.Containers {
		c := *s
		q.Containers = append(q.Containers, &c)
	}
	return &q
}

func (f *fakeRuntime) ListPods(context.Context) ([]*cruntime.Pod, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]*cruntime.Pod, 0, len(f.pods))
	for _, p := range f.pods {
		out = append(out, clonePod(p))
	}
	return out, nil
}

func (f *fakeRuntime) ListPod(_ context.Context, uid types.UID) (*cruntime.Pod, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, p := range f.pods {
		if p.UID == uid {
			return clonePod(p), nil
		}
	}
	return nil, nil
}

func (f *fakeRuntime) ItemStatuses(_ context.Context, p *cruntime.Pod, sbs, cts []*cruntime.Container) ([]*cruntime.SandboxStatus, []*cruntime.ContainerStatus, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.fail[p.UID]; err != nil {
		return nil, nil, err
	}
	base := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	var sbOut []*cruntime.SandboxStatus
	for _, s := range sbs {
		sbOut = append(sbOut, &cruntime.SandboxStatus{ID: s.ID, State: s.State,
			Attempt: s.Attempt, CreatedAt: time.Unix(0, s.CreatedAt).UTC(), IPs: f.ips[p.UID]})
	}
	var ctOut []*cruntime.ContainerStatus
	for _, c := range cts {
		cs := &cruntime.ContainerStatus{ID: c.ID, Name: c.Name, Attempt: c.Attempt, State: c.State,
			Image: c.Image, StartedAt: base}
		if c.State == cruntime.StateExited {
			cs.ExitCode = f.exitCodes[c.ID]
			cs.FinishedAt = base.Add(time.Minute)
			cs.Reason = "Error"
		}
		ctOut = append(ctOut, cs)
	}
	return sbOut, ctOut, nil
}

// startGenerator runs a generator over rt with a short period until the
// test ends, and waits for its first successful relist.
func startGenerator(t *testing.T, rt cruntime.Runtime) *pleg.Generator {
	t.Helper()
	g, err := pleg.New(pleg.Options{Runtime: rt, RelistPeriod: 10 * time.Millisecond, Events: pleg.EventsOff})
	if err != nil {
		t.Fatal(err)
	}
	g.Start()
	t.Cleanup(g.Stop)
	waitFor(t, "the first relist", func() bool { return !g.LastRelist().IsZero() })
	return g
}

// waitFor polls cond until it holds or 30 s pass: long enough for any
// machine, however busy; a test that passes does not wait for it.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitRelisted waits for a relist of pods pods to have ended without a
// listing error: every cache entry it set and every event it delivered
// are in place (the cache is set before a pod's events are delivered, so
// a full cache alone does not say the events are).
func waitRelisted(t *testing.T, g *pleg.Generator, pods int) {
	t.Helper()
	waitFor(t, fmt.Sprintf("a relist of %d pods to end", pods), func() bool {
		for _, s := range g.RecentRelists() {
			if s.Err == "" && s.Pods == pods {
				return true
			}
		}
		return false
	})
}

// healthOverride is a generator whose health is set by the test.
type healthOverride struct {
	*pleg.Generator
	err error
}

func (h healthOverride) Healthy() (bool, error) { return h.err == nil, h.err }

// fixedCondition is a ReadyConditioner returning c.
type fixedCondition pleg.Condition

func (c fixedCondition) Condition() pleg.Condition { return pleg.Condition(c) }

var errInspect = errors.New("rpc error: code = DeadlineExceeded desc = context deadline exceeded")

func (f *fakeRuntime) Identities(context.Context, *cruntime.Pod, []*cruntime.Container) ([]*cruntime.Identity, error) {
	return nil, cruntime.ErrIdentityUnsupported
}
