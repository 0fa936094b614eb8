package cri

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/metrics"
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
// It is cruntime.FetchPodStatus over ItemStatuses: the status is assembled
// by cruntime.NewPodStatus, sandboxes and containers newest first, the pod
// IPs those of the newest sandbox, only if it is ready.
func (c *Client) PodStatus(ctx context.Context, pod *cruntime.Pod) (*cruntime.PodStatus, error) {
	if pod == nil {
		return nil, errors.New("PodStatus: nil pod")
	}
	return cruntime.FetchPodStatus(ctx, c, pod)
}

// ItemStatuses fetches the status of the given sandboxes and containers of
// pod (cruntime.Runtime), with the calls, bounds and errors of
// PodStatus. Nil items are skipped; an item the runtime no longer knows is
// nil in the result.
func (c *Client) ItemStatuses(ctx context.Context, pod *cruntime.Pod, sandboxes, containers []*cruntime.Container) ([]*cruntime.SandboxStatus, []*cruntime.ContainerStatus, error) {
	if pod == nil {
		return nil, nil, errors.New("ItemStatuses: nil pod")
	}
	sbOut := make([]*cruntime.SandboxStatus, len(sandboxes))
	ctOut := make([]*cruntime.ContainerStatus, len(containers))
	err := c.each(ctx, len(sandboxes)+len(containers), func(ctx context.Context, i int) error {
		if i < len(sandboxes) {
			sb := sandboxes[i]
			if sb == nil {
				return nil
			}
			s, err := c.sandboxStatus(ctx, sb.ID)
			if isNotFound(err) {
				c.log.V(4).Info("Sandbox vanished before its status was fetched", "pod", pod.UID, "sandboxID", sb.ID)
				return nil
			}
			if err == nil && s != nil {
				sbOut[i] = convertSandbox(s, sb, c.labels)
			}
			return err
		}
		i -= len(sandboxes)
		ct := containers[i]
		if ct == nil {
			return nil
		}
		resp, err := c.containerStatus(ctx, ct.ID, c.verbose != nil)
		s := resp.GetStatus()
		if isNotFound(err) {
			c.log.V(4).Info("Container vanished before its status was fetched", "pod", pod.UID, "containerID", ct.ID)
			return nil
		}
		if err == nil && s != nil {
			ctOut[i] = convertContainer(s, ct, c.labels)
			ctOut[i].ImageRef = c.shared.String(ctOut[i].ImageRef)
		}
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	return sbOut, ctOut, nil
}

// labels is the labels of m, their strings and equal sets shared with
// the statuses before (the client's Interner).
func (c *Client) labels(m map[string]string) cruntime.Labels {
	return c.shared.Labels(m)
}

// convertSandbox converts the status of the listed sandbox sb, its labels
// and annotations through labels.
func convertSandbox(s *runtimeapi.PodSandboxStatus, sb *cruntime.Container, labels func(map[string]string) cruntime.Labels) *cruntime.SandboxStatus {
	st := &cruntime.SandboxStatus{
		ID:          s.Id,
		State:       sandboxState(s.State),
		CreatedAt:   nsTime(s.CreatedAt),
		Attempt:     s.GetMetadata().GetAttempt(),
		IPs:         sandboxIPs(s),
		HostNetwork: s.GetLinux().GetNamespaces().GetOptions().GetNetwork() == runtimeapi.NamespaceMode_NODE,
		Labels:      labels(s.Labels),
		Annotations: labels(s.Annotations),
	}
	if st.ID == "" {
		st.ID = sb.ID
	}
	st.ID = same(st.ID, sb.ID)
	return st
}

// convertContainer converts the status of the listed container ct, its
// labels and annotations through labels.
func convertContainer(s *runtimeapi.ContainerStatus, ct *cruntime.Container, labels func(map[string]string) cruntime.Labels) *cruntime.ContainerStatus {
	st := &cruntime.ContainerStatus{
		ID:          s.Id,
		Name:        s.GetMetadata().GetName(),
		Attempt:     s.GetMetadata().GetAttempt(),
		State:       containerState(s.State),
		Image:       s.GetImage().GetImage(),
		ImageRef:    s.ImageRef,
		CreatedAt:   nsTime(s.CreatedAt),
		StartedAt:   nsTime(s.StartedAt),
		FinishedAt:  nsTime(s.FinishedAt),
		ExitCode:    s.ExitCode,
		Reason:      s.Reason,
		Message:     s.Message,
		Labels:      labels(s.Labels),
		Annotations: labels(s.Annotations),
	}
	if st.ID == "" {
		st.ID = ct.ID
	}
	if st.Name == "" {
		st.Name = s.GetLabels()[cruntime.LabelContainerName]
	}
	if st.Name == "" {
		st.Name = ct.Name
	}
	// The cache keeps statuses for as long as the pod lives: share the
	// listing's copies of the strings both have instead of keeping two.
	st.ID, st.Name, st.Image = same(st.ID, ct.ID), same(st.Name, ct.Name), same(st.Image, ct.Image)
	return st
}

// same returns listed when it equals s: one copy of a string the listing
// and a status both hold.
func same(s, listed string) string {
	if s == listed {
		return listed
	}
	return s
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

// containerStatus makes one ContainerStatus call; verbose asks for the
// runtime's info too (Identities, WithVerboseStatuses), and hands the
// answer to c.verbose.
func (c *Client) containerStatus(ctx context.Context, id string, verbose bool) (*runtimeapi.ContainerStatusResponse, error) {
	var resp *runtimeapi.ContainerStatusResponse
	err := c.call(ctx, metrics.OpContainerStatus, "ContainerStatus", id, func(ctx context.Context) (err error) {
		resp, err = c.rs.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id, Verbose: verbose})
		return err
	})
	if err == nil && verbose && c.verbose != nil && resp.GetStatus() != nil {
		c.verbose.ContainerVerbose(id, containerState(resp.Status.State), resp)
	}
	return resp, err
}

// Identities fetches the init PID and cgroup path of each of containers
// with a verbose ContainerStatus call (cruntime.Runtime): containerd and
// CRI-O put them in the verbose info's JSON ("pid", and
// "runtimeSpec.linux.cgroupsPath"). The calls are bounded as PodStatus's;
// a container the runtime no longer knows, or whose info has no PID, is
// nil.
func (c *Client) Identities(ctx context.Context, pod *cruntime.Pod, containers []*cruntime.Container) ([]*cruntime.Identity, error) {
	out := make([]*cruntime.Identity, len(containers))
	err := c.each(ctx, len(containers), func(ctx context.Context, i int) error {
		ct := containers[i]
		if ct == nil {
			return nil
		}
		resp, err := c.containerStatus(ctx, ct.ID, true)
		if isNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		out[i] = identityFromInfo(resp.GetInfo())
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// identityFromInfo reads a verbose ContainerStatus's info: its "info" key
// holds JSON with the init PID and the OCI runtime spec. Nil without a
// PID.
func identityFromInfo(info map[string]string) *cruntime.Identity {
	var v struct {
		PID         int64 `json:"pid"`
		RuntimeSpec struct {
			Linux struct {
				CgroupsPath string `json:"cgroupsPath"`
			} `json:"linux"`
		} `json:"runtimeSpec"`
	}
	if err := json.Unmarshal([]byte(info["info"]), &v); err != nil || v.PID <= 0 {
		return nil
	}
	return &cruntime.Identity{PID: v.PID, CgroupPath: v.RuntimeSpec.Linux.CgroupsPath}
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
func (c *Client) Status(ctx context.Context) ([]cruntime.Condition, error) {
	var resp *runtimeapi.StatusResponse
	err := c.call(ctx, metrics.OpStatus, "Status", "", func(ctx context.Context) (err error) {
		resp, err = c.rs.Status(ctx, &runtimeapi.StatusRequest{})
		return err
	})
	if err != nil {
		return nil, err
	}
	if resp.GetStatus() == nil {
		return nil, fmt.Errorf("%w: Status: runtime at %s returned no status", cruntime.ErrMalformed, c.endpoint)
	}
	conds := make([]cruntime.Condition, 0, len(resp.Status.Conditions))
	for _, rc := range resp.Status.Conditions {
		if rc == nil {
			continue
		}
		conds = append(conds, cruntime.Condition{
			Type:    rc.Type,
			Status:  rc.Status,
			Reason:  rc.Reason,
			Message: rc.Message,
		})
	}
	return conds, nil
}
