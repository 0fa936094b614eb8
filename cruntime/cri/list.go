package cri

import (
	"context"
	"errors"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/metrics"
)

// ListPods lists every sandbox and container, in every state, with one
// unfiltered ListPodSandbox and one unfiltered ListContainers call, and
// groups them by pod UID. The replies are decoded straight from the wire
// (see wire.go), and what did not change since the previous listing is
// neither decoded nor built again (see memo.go): this is the call a relist
// makes every period.
//
// Pods are sorted by UID. Within a pod, sandboxes and containers keep the
// order the runtime listed them in (for a pod that did not change, the
// order of the listing that built it). Items without metadata, ID or pod
// UID are skipped, neither kept nor allocated, and counted in one V(4) log
// line per reply. The pods returned are shared with later listings:
// callers must not modify them.
func (c *Client) ListPods(ctx context.Context) ([]*cruntime.Pod, error) {
	m := &c.memo
	if !m.mu.TryLock() {
		// Another listing is using the memo (the generator lists from one
		// goroutine; this is some other caller): list without it.
		return c.listPods(ctx, nil)
	}
	defer m.mu.Unlock()
	return c.listPods(ctx, m)
}

// listPods lists with the memo m (held), or without one when m is nil.
func (c *Client) listPods(ctx context.Context, m *memo) ([]*cruntime.Pod, error) {
	l := startListing(m)
	// Streamed or unary (liststream.go): the same items into the same
	// replies.
	err := c.list(ctx, listSandboxesCall, &l.sandboxes)
	if err == nil {
		err = c.list(ctx, listContainersCall, &l.containers)
	}
	if err != nil {
		// The items decoded so far stay in the memo until the next
		// complete listing's commit: each is what its bytes decode to.
		return nil, err
	}
	pods := c.endListing(l)
	// A complete listing ends a round of the statuses' sharing: what no
	// pod used since the last sweep may go (cruntime.Interner).
	c.shared.Round()
	return pods, nil
}

// listing is an unfiltered listing being made: its two replies, decoded
// with the memo m (held by the caller) or without one when m is nil.
type listing struct {
	m                     *memo
	sandboxes, containers listReply
	strs                  *interner
	strings               *table
	sc                    *groupScratch
}

// startListing starts a listing; its replies are decoded into
// l.sandboxes and l.containers.
func startListing(m *memo) *listing {
	l := &listing{m: m, sandboxes: listReply{sandboxes: true}}
	if m != nil {
		m.begin()
		l.strs, l.sc = &m.strings, &m.scratch
		l.sandboxes.memo, l.sandboxes.seed, l.sandboxes.items = &m.sandboxes, m.seed, l.sc.sandboxes[:0]
		l.containers.memo, l.containers.seed, l.containers.items = &m.containers, m.seed, l.sc.containers[:0]
	} else {
		l.strs, l.sc = &interner{}, &groupScratch{}
	}
	l.strings = l.strs.begin()
	l.sandboxes.strings, l.containers.strings = l.strings, l.strings
	return l
}

// endListing groups the listing l, whose two replies were decoded without
// error, and makes it the memo's last listing.
func (c *Client) endListing(l *listing) []*cruntime.Pod {
	l.strs.end(l.strings)
	c.logSkipped(&l.sandboxes, "sandbox")
	c.logSkipped(&l.containers, "container")
	m, sc := l.m, l.sc
	nsb, nct := len(l.sandboxes.items), len(l.containers.items)
	if m != nil {
		sc.sandboxes, sc.containers = l.sandboxes.items[:0], l.containers.items[:0]
		if m.unchanged(nsb, nct) {
			// The steady state: the last listing again, nothing to group.
			m.sandboxes.commit()
			m.containers.commit()
			return slices.Clone(m.last)
		}
	}
	pods := c.group(l.sandboxes.items, l.containers.items, sc, m)
	if m != nil {
		m.keep(pods, nsb, nct)
		m.commit()
	}
	return pods
}

// logSkipped logs, at V(4), the items of a reply the decoder left out: one
// line per reply, however many.
func (c *Client) logSkipped(r *listReply, kind string) {
	if r.skipped == [numSkipReasons]int{} {
		return
	}
	if log := c.log.V(4); log.Enabled() {
		log.Info("Skipping listed items that cannot be grouped", "kind", kind,
			"emptyID", r.skipped[skipNoID], "noMetadata", r.skipped[skipNoMetadata], "noPodUID", r.skipped[skipNoUID],
			"firstID", r.firstSkipped.id, "firstReason", r.firstSkipped.reason.String())
	}
}

// ListPod lists the sandboxes and containers of the pod with the given UID,
// filtering on the label io.kubernetes.pod.uid in the runtime. It returns
// (nil, nil) when the runtime has nothing for uid.
func (c *Client) ListPod(ctx context.Context, uid types.UID) (*cruntime.Pod, error) {
	if uid == "" {
		return nil, errors.New("ListPod: empty pod UID")
	}
	labels := map[string]string{cruntime.LabelPodUID: string(uid)}
	var sandboxes []*runtimeapi.PodSandbox
	err := c.call(ctx, metrics.OpListPodSandbox, "ListPodSandbox", "", func(ctx context.Context) error {
		resp, err := c.rs.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{LabelSelector: labels}})
		sandboxes = resp.GetItems()
		return err
	})
	if err != nil {
		return nil, err
	}
	var containers []*runtimeapi.Container
	err = c.call(ctx, metrics.OpListContainers, "ListContainers", "", func(ctx context.Context) error {
		resp, err := c.rs.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{LabelSelector: labels}})
		containers = resp.GetContainers()
		return err
	})
	if err != nil {
		return nil, err
	}
	sbs := make([]itemRef, 0, len(sandboxes))
	for _, s := range sandboxes {
		it := sandboxItem(s)
		sbs = append(sbs, itemRef{listed: &it})
	}
	cts := make([]itemRef, 0, len(containers))
	for _, ct := range containers {
		it := containerItem(ct)
		cts = append(cts, itemRef{listed: &it})
	}
	// The runtime filters already; keep only uid should it not.
	for _, p := range c.group(sbs, cts, &groupScratch{}, nil) {
		if p.UID == uid {
			return p, nil
		}
	}
	return nil, nil
}

// sandboxItem converts a decoded sandbox (nil-safe).
func sandboxItem(s *runtimeapi.PodSandbox) listed {
	md := s.GetMetadata()
	return listed{
		Container: cruntime.Container{ID: s.GetId(), Name: md.GetName(), Attempt: md.GetAttempt(),
			State: sandboxState(s.GetState()), CreatedAt: s.GetCreatedAt()},
		meta: md != nil, podName: md.GetName(), uid: md.GetUid(), podNamespace: md.GetNamespace(),
	}
}

// containerItem converts a decoded container (nil-safe).
func containerItem(ct *runtimeapi.Container) listed {
	md := ct.GetMetadata()
	labels := ct.GetLabels()
	name := md.GetName()
	if name == "" {
		name = labels[cruntime.LabelContainerName]
	}
	return listed{
		Container: cruntime.Container{ID: ct.GetId(), Name: name, Attempt: md.GetAttempt(),
			State: containerState(ct.GetState()), Image: ct.GetImage().GetImage(), CreatedAt: ct.GetCreatedAt()},
		meta: md != nil, uid: labels[cruntime.LabelPodUID], podName: labels[cruntime.LabelPodName],
		podNamespace: labels[cruntime.LabelPodNamespace],
	}
}

// groupScratch is the working space of group, kept from one listing to
// the next by the memo.
type groupScratch struct {
	sandboxes, containers []itemRef // the decoded replies
	builds                map[string]int
	pods                  []podBuild
	valid                 []bool
}

// podBuild is one pod being grouped.
type podBuild struct {
	uid, name, namespace string
	sbs, cts             int
	fresh                bool // it has an item that was decoded, not taken from the memo
	pod                  *cruntime.Pod
	fill                 bool // pod is new: pass 2 gives it its items
}

// group groups listed sandboxes and containers by pod UID; see ListPods.
// With the memo m, a pod whose items all come from the previous listing,
// and as many, is the pod built then.
//
// Each pod's items share one backing array of their own, so a pod record
// the generator keeps for long pins only that pod's items, never a whole
// listing.
func (c *Client) group(sandboxes, containers []itemRef, sc *groupScratch, m *memo) []*cruntime.Pod {
	if sc.builds == nil {
		sc.builds = make(map[string]int, len(sandboxes))
	}
	clear(sc.builds)
	sc.pods = sc.pods[:0]
	find := func(it itemRef) *podBuild {
		i, ok := sc.builds[it.uid]
		if !ok {
			i = len(sc.pods)
			sc.pods = append(sc.pods, podBuild{uid: it.uid})
			sc.builds[it.uid] = i
		}
		b := &sc.pods[i]
		if b.name == "" && b.namespace == "" {
			b.name, b.namespace = it.podName, it.podNamespace
		}
		b.fresh = b.fresh || !it.reused
		return b
	}
	// Pass 1: skip what cannot be grouped, count the rest per pod.
	n := len(sandboxes) + len(containers)
	if cap(sc.valid) < n {
		sc.valid = make([]bool, n)
	}
	valid := sc.valid[:n]
	clear(valid)
	for i := range sandboxes {
		s := sandboxes[i]
		if why := skipped(len(s.ID), s.meta, len(s.uid)); why != skipNone {
			c.log.V(4).Info("Skipping listed sandbox", "reason", why.String(), "sandboxID", s.ID, "index", i)
			continue
		}
		valid[i] = true
		find(s).sbs++
	}
	for i := range containers {
		ct := containers[i]
		if why := skipped(len(ct.ID), ct.meta, len(ct.uid)); why != skipNone {
			c.log.V(4).Info("Skipping listed container", "reason", why.String(), "containerID", ct.ID, "index", i)
			continue
		}
		valid[len(sandboxes)+i] = true
		find(ct).cts++
	}
	out := make([]*cruntime.Pod, len(sc.pods))
	for i := range sc.pods {
		b := &sc.pods[i]
		if m != nil && !b.fresh {
			if prev, ok := m.pods[b.uid]; ok && prev.items == b.sbs+b.cts {
				b.pod = prev.pod // unchanged: pass 2 skips it
			}
		}
		if b.pod == nil {
			b.pod = &cruntime.Pod{UID: types.UID(b.uid), Name: b.name, Namespace: b.namespace}
			b.fill = true
			ptrs := make([]*cruntime.Container, b.sbs+b.cts)
			if b.sbs > 0 {
				b.pod.Sandboxes = ptrs[:0:b.sbs]
			}
			if b.cts > 0 {
				b.pod.Containers = ptrs[b.sbs:b.sbs:len(ptrs)]
			}
		}
		if m != nil {
			m.next[b.uid] = memoPod{pod: b.pod, items: b.sbs + b.cts}
		}
		out[i] = b.pod
	}
	// Pass 2: fill each new pod's own array.
	for i := range sandboxes {
		if !valid[i] {
			continue
		}
		s := sandboxes[i]
		b := &sc.pods[sc.builds[s.uid]]
		if !b.fill {
			continue // the previous listing's pod
		}
		b.pod.Sandboxes = append(b.pod.Sandboxes, &s.Container)
	}
	for i := range containers {
		if !valid[len(sandboxes)+i] {
			continue
		}
		ct := containers[i]
		b := &sc.pods[sc.builds[ct.uid]]
		if !b.fill {
			continue
		}
		b.pod.Containers = append(b.pod.Containers, &ct.Container)
	}
	// Drop the references, so the scratch space pins no pod.
	for i := range sc.pods {
		sc.pods[i] = podBuild{}
	}
	slices.SortFunc(out, func(a, b *cruntime.Pod) int { return strings.Compare(string(a.UID), string(b.UID)) })
	return out
}

// containerState maps a CRI container state; values unknown to us map to
// StateUnknown.
func containerState(s runtimeapi.ContainerState) cruntime.State {
	switch s {
	case runtimeapi.ContainerState_CONTAINER_CREATED:
		return cruntime.StateCreated
	case runtimeapi.ContainerState_CONTAINER_RUNNING:
		return cruntime.StateRunning
	case runtimeapi.ContainerState_CONTAINER_EXITED:
		return cruntime.StateExited
	default:
		return cruntime.StateUnknown
	}
}

// sandboxState maps a CRI sandbox state: ready is running, not ready is
// exited, anything else unknown.
func sandboxState(s runtimeapi.PodSandboxState) cruntime.State {
	switch s {
	case runtimeapi.PodSandboxState_SANDBOX_READY:
		return cruntime.StateRunning
	case runtimeapi.PodSandboxState_SANDBOX_NOTREADY:
		return cruntime.StateExited
	default:
		return cruntime.StateUnknown
	}
}
