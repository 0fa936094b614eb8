package cri

import (
	"context"
	"errors"
	"sort"

	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podlifecycle/pleg/metrics"
	"github.com/podlifecycle/pleg/runtime"
)

// ListPods lists every sandbox and container, in every state, with one
// unfiltered ListPodSandbox and one unfiltered ListContainers call, and
// groups them by pod UID.
//
// Pods are sorted by UID. Within a pod, sandboxes and containers keep the
// order the runtime listed them in. Items without metadata, ID or pod UID
// are skipped and logged at V(4).
func (c *Client) ListPods(ctx context.Context) ([]*runtime.Pod, error) {
	sandboxes, containers, err := c.list(ctx, nil)
	if err != nil {
		return nil, err
	}
	return c.group(sandboxes, containers), nil
}

// ListPod lists the sandboxes and containers of the pod with the given UID,
// filtering on the label io.kubernetes.pod.uid in the runtime. It returns
// (nil, nil) when the runtime has nothing for uid.
func (c *Client) ListPod(ctx context.Context, uid types.UID) (*runtime.Pod, error) {
	if uid == "" {
		return nil, errors.New("ListPod: empty pod UID")
	}
	sandboxes, containers, err := c.list(ctx, map[string]string{runtime.LabelPodUID: string(uid)})
	if err != nil {
		return nil, err
	}
	// The runtime filters already; keep only uid should it not.
	for _, p := range c.group(sandboxes, containers) {
		if p.UID == uid {
			return p, nil
		}
	}
	return nil, nil
}

// list runs ListPodSandbox and ListContainers, filtered by labels when
// labels is not nil.
func (c *Client) list(ctx context.Context, labels map[string]string) ([]*runtimeapi.PodSandbox, []*runtimeapi.Container, error) {
	sreq := &runtimeapi.ListPodSandboxRequest{}
	creq := &runtimeapi.ListContainersRequest{}
	if labels != nil {
		sreq.Filter = &runtimeapi.PodSandboxFilter{LabelSelector: labels}
		creq.Filter = &runtimeapi.ContainerFilter{LabelSelector: labels}
	}
	var sandboxes []*runtimeapi.PodSandbox
	err := c.call(ctx, metrics.OpListPodSandbox, "ListPodSandbox", "", func(ctx context.Context) error {
		resp, err := c.rs.ListPodSandbox(ctx, sreq)
		sandboxes = resp.GetItems()
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	var containers []*runtimeapi.Container
	err = c.call(ctx, metrics.OpListContainers, "ListContainers", "", func(ctx context.Context) error {
		resp, err := c.rs.ListContainers(ctx, creq)
		containers = resp.GetContainers()
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	return sandboxes, containers, nil
}

// group groups listed sandboxes and containers by pod UID; see ListPods.
func (c *Client) group(sandboxes []*runtimeapi.PodSandbox, containers []*runtimeapi.Container) []*runtime.Pod {
	pods := make(map[types.UID]*runtime.Pod)
	pod := func(uid types.UID) *runtime.Pod {
		p, ok := pods[uid]
		if !ok {
			p = &runtime.Pod{UID: uid}
			pods[uid] = p
		}
		return p
	}

	for i, s := range sandboxes {
		md := s.GetMetadata()
		switch {
		case s == nil:
			c.log.V(4).Info("Skipping listed sandbox", "reason", "nil item", "index", i)
			continue
		case s.Id == "":
			c.log.V(4).Info("Skipping listed sandbox", "reason", "empty ID", "index", i)
			continue
		case md == nil:
			c.log.V(4).Info("Skipping listed sandbox", "reason", "no metadata", "sandboxID", s.Id)
			continue
		case md.Uid == "":
			c.log.V(4).Info("Skipping listed sandbox", "reason", "empty pod UID in metadata", "sandboxID", s.Id)
			continue
		}
		p := pod(types.UID(md.Uid))
		if p.Name == "" && p.Namespace == "" {
			p.Name, p.Namespace = md.Name, md.Namespace
		}
		p.Sandboxes = append(p.Sandboxes, &runtime.Container{
			ID:        s.Id,
			Name:      md.Name,
			Attempt:   md.Attempt,
			State:     sandboxState(s.State),
			CreatedAt: s.CreatedAt,
		})
	}

	for i, ct := range containers {
		md := ct.GetMetadata()
		labels := ct.GetLabels() // nil-safe reads
		uid := labels[runtime.LabelPodUID]
		switch {
		case ct == nil:
			c.log.V(4).Info("Skipping listed container", "reason", "nil item", "index", i)
			continue
		case ct.Id == "":
			c.log.V(4).Info("Skipping listed container", "reason", "empty ID", "index", i)
			continue
		case md == nil:
			c.log.V(4).Info("Skipping listed container", "reason", "no metadata", "containerID", ct.Id)
			continue
		case uid == "":
			c.log.V(4).Info("Skipping listed container", "reason", "no label "+runtime.LabelPodUID, "containerID", ct.Id)
			continue
		}
		p := pod(types.UID(uid))
		if p.Name == "" && p.Namespace == "" {
			p.Name, p.Namespace = labels[runtime.LabelPodName], labels[runtime.LabelPodNamespace]
		}
		name := md.Name
		if name == "" {
			name = labels[runtime.LabelContainerName]
		}
		p.Containers = append(p.Containers, &runtime.Container{
			ID:        ct.Id,
			Name:      name,
			Attempt:   md.Attempt,
			State:     containerState(ct.State),
			Image:     ct.GetImage().GetImage(),
			CreatedAt: ct.CreatedAt,
		})
	}

	out := make([]*runtime.Pod, 0, len(pods))
	for _, p := range pods {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].UID < out[j].UID })
	return out
}

// containerState maps a CRI container state; values unknown to us map to
// StateUnknown.
func containerState(s runtimeapi.ContainerState) runtime.State {
	switch s {
	case runtimeapi.ContainerState_CONTAINER_CREATED:
		return runtime.StateCreated
	case runtimeapi.ContainerState_CONTAINER_RUNNING:
		return runtime.StateRunning
	case runtimeapi.ContainerState_CONTAINER_EXITED:
		return runtime.StateExited
	default:
		return runtime.StateUnknown
	}
}

// sandboxState maps a CRI sandbox state: ready is running, not ready is
// exited, anything else unknown.
func sandboxState(s runtimeapi.PodSandboxState) runtime.State {
	switch s {
	case runtimeapi.PodSandboxState_SANDBOX_READY:
		return runtime.StateRunning
	case runtimeapi.PodSandboxState_SANDBOX_NOTREADY:
		return runtime.StateExited
	default:
		return runtime.StateUnknown
	}
}
