package cri

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podlifecycle/pleg/metrics"
	"github.com/podlifecycle/pleg/runtime"
)

// PodStatus fetches the full status of pod: one PodSandboxStatus call per
// sandbox and one ContainerStatus call per container of pod, by the IDs in
// pod. At most WithStatusConcurrency calls of the pod are out at once (1:
// one after the other, sandboxes first, as the kubelet does).
//
// An item the runtime no longer knows (NotFound) is left out. Any other
// error ends the fetch (cancelling the calls still out): PodStatus returns a
// nil status and the error, which names the call and ID and wraps the gRPC
// error.
//
// Sandbox and container statuses are sorted newest first (by creation
// time). The pod IPs are those of the newest sandbox, only if it is ready.
func (c *Client) PodStatus(ctx context.Context, pod *runtime.Pod) (*runtime.PodStatus, error) {
	if pod == nil {
		return nil, errors.New("PodStatus: nil pod")
	}
	var sbs, cts []*runtime.Container
	for _, sb := range pod.Sandboxes {
		if sb != nil {
			sbs = append(sbs, sb)
		}
	}
	for _, ct := range pod.Containers {
		if ct != nil {
			cts = append(cts, ct)
		}
	}
	sbRes := make([]*runtimeapi.PodSandboxStatus, len(sbs))
	ctRes := make([]*runtimeapi.ContainerStatus, len(cts))
	err := c.each(ctx, len(sbs)+len(cts), func(ctx context.Context, i int) error {
		var err error
		if i < len(sbs) {
			sbRes[i], err = c.sandboxStatus(ctx, sbs[i].ID)
			if isNotFound(err) {
				c.log.V(4).Info("Sandbox vanished before its status was fetched", "pod", pod.UID, "sandboxID", sbs[i].ID)
				return nil
			}
			return err
		}
		i -= len(sbs)
		ctRes[i], err = c.containerStatus(ctx, cts[i].ID)
		if isNotFound(err) {
			c.log.V(4).Info("Container vanished before its status was fetched", "pod", pod.UID, "containerID", cts[i].ID)
			return nil
		}
		return err
	})
	if err != nil {
		return nil, err
	}

	ps := &runtime.PodStatus{UID: pod.UID, Name: pod.Name, Namespace: pod.Namespace}
	for i, s := range sbRes {
		if s == nil {
			continue // vanished, or the runtime sent no status
		}
		st := &runtime.SandboxStatus{
			ID:          s.Id,
			State:       sandboxState(s.State),
			CreatedAt:   nsTime(s.CreatedAt),
			Attempt:     s.GetMetadata().GetAttempt(),
			IPs:         sandboxIPs(s),
			HostNetwork: s.GetLinux().GetNamespaces().GetOptions().GetNetwork() == runtimeapi.NamespaceMode_NODE,
		}
		if st.ID == "" {
			st.ID = sbs[i].ID
		}
		ps.SandboxStatuses = append(ps.SandboxStatuses, st)
	}
	sort.SliceStable(ps.SandboxStatuses, func(i, j int) bool {
		return ps.SandboxStatuses[i].CreatedAt.After(ps.SandboxStatuses[j].CreatedAt)
	})
	if len(ps.SandboxStatuses) > 0 && ps.SandboxStatuses[0].State == runtime.StateRunning && len(ps.SandboxStatuses[0].IPs) > 0 {
		ps.IPs = append([]string(nil), ps.SandboxStatuses[0].IPs...)
	}

	for i, s := range ctRes {
		if s == nil {
			continue
		}
		st := &runtime.ContainerStatus{
			ID:         s.Id,
			Name:       s.GetMetadata().GetName(),
			Attempt:    s.GetMetadata().GetAttempt(),
			State:      containerState(s.State),
			Image:      s.GetImage().GetImage(),
			ImageRef:   s.ImageRef,
			CreatedAt:  nsTime(s.CreatedAt),
			StartedAt:  nsTime(s.StartedAt),
			FinishedAt: nsTime(s.FinishedAt),
			ExitCode:   s.ExitCode,
			Reason:     s.Reason,
			Message:    s.Message,
		}
		if st.ID == "" {
			st.ID = cts[i].ID
		}
		if st.Name == "" {
			st.Name = s.GetLabels()[runtime.LabelContainerName]
		}
		if st.Name == "" {
			st.Name = cts[i].Name
		}
		ps.ContainerStatuses = append(ps.ContainerStatuses, st)
	}
	sort.SliceStable(ps.ContainerStatuses, func(i, j int) bool {
		return ps.ContainerStatuses[i].CreatedAt.After(ps.ContainerStatuses[j].CreatedAt)
	})
	return ps, nil
}

// each runs f(ctx, i) for every i in [0, n), at most c.statusConcurrency
// at once (in order when 1), and returns the first error; the first error
// cancels the calls still out.
func (c *Client) each(ctx context.Context, n int, f func(context.Context, int) error) error {
	if c.statusConcurrency <= 1 || n <= 1 {
		for i := range n {
			if err := f(ctx, i); err != nil {
				return err
			}
		}
		return nil
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	slots := make(chan struct{}, c.statusConcurrency)
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	fail := func(err error) { once.Do(func() { first = err; cancel() }) }
dispatch:
	for i := range n {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			break dispatch
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			if err := f(ctx, i); err != nil {
				fail(err)
			}
		}()
	}
	wg.Wait()
	if first == nil && ctx.Err() != nil {
		return context.Cause(ctx)
	}
	return first
}

func (c *Client) sandboxStatus(ctx context.Context, id string) (*runtimeapi.PodSandboxStatus, error) {
	var s *runtimeapi.PodSandboxStatus
	err := c.call(ctx, metrics.OpPodSandboxStatus, "PodSandboxStatus", id, func(ctx context.Context) error {
		resp, err := c.rs.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: id})
		s = resp.GetStatus()
		return err
	})
	return s, err
}

func (c *Client) containerStatus(ctx context.Context, id string) (*runtimeapi.ContainerStatus, error) {
	var s *runtimeapi.ContainerStatus
	err := c.call(ctx, metrics.OpContainerStatus, "ContainerStatus", id, func(ctx context.Context) error {
		resp, err := c.rs.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
		s = resp.GetStatus()
		return err
	})
	return s, err
}

// sandboxIPs returns the IPs of a sandbox, primary first, without empties.
func sandboxIPs(s *runtimeapi.PodSandboxStatus) []string {
	n := s.GetNetwork()
	if n == nil {
		return nil
	}
	var ips []string
	if n.Ip != "" {
		ips = append(ips, n.Ip)
	}
	for _, ip := range n.AdditionalIps {
		if ip.GetIp() != "" {
			ips = append(ips, ip.GetIp())
		}
	}
	return ips
}

// nsTime converts CRI nanoseconds since the epoch; 0 is the zero time.
func nsTime(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// Status returns the runtime's conditions (CRI Status), such as
// RuntimeReady and NetworkReady.
func (c *Client) Status(ctx context.Context) ([]runtime.Condition, error) {
	var resp *runtimeapi.StatusResponse
	err := c.call(ctx, metrics.OpStatus, "Status", "", func(ctx context.Context) (err error) {
		resp, err = c.rs.Status(ctx, &runtimeapi.StatusRequest{})
		return err
	})
	if err != nil {
		return nil, err
	}
	if resp.GetStatus() == nil {
		return nil, fmt.Errorf("Status: runtime at %s returned no status", c.endpoint)
	}
	conds := make([]runtime.Condition, 0, len(resp.Status.Conditions))
	for _, rc := range resp.Status.Conditions {
		if rc == nil {
			continue
		}
		conds = append(conds, runtime.Condition{
			Type:    rc.Type,
			Status:  rc.Status,
			Reason:  rc.Reason,
			Message: rc.Message,
		})
	}
	return conds, nil
}
