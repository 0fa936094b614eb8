package criserve

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/utils/clock"

	"github.com/podlifecycle/pleg/cruntime"
)

// bucket is a token bucket on a clock: rate tokens a second, at most
// burst.
type bucket struct {
	clock  clock.Clock
	rate   float64
	burst  float64
	mu     sync.Mutex
	tokens float64
	last   time.Time
}

func newBucket(c clock.Clock, rate float64, burst int) *bucket {
	return &bucket{clock: c, rate: rate, burst: float64(burst), tokens: float64(burst), last: c.Now()}
}

// take takes a token if one comes within budget, and returns how long to
// wait for it; ok is false (nothing taken) when it would come later.
func (b *bucket) take(budget time.Duration) (wait time.Duration, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.clock.Now()
	b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	b.last = now
	if b.tokens >= 1 {
		b.tokens--
		return 0, true
	}
	wait = time.Duration((1 - b.tokens) / b.rate * float64(time.Second))
	if wait > budget {
		return wait, false
	}
	b.tokens--
	return wait, true
}

// errNoUpstream answers a passed-through call when the server has no
// runtime client.
var errNoUpstream = status.Error(codes.Unavailable, "pleg's CRI endpoint has no runtime to pass this call to")

// admit waits for the rate and a concurrency slot within ctx (which
// carries the call's timeout) and returns the slot's release.
func (s *Server) admit(ctx context.Context, method string) (func(), error) {
	budget := s.cfg.Timeout
	if d, ok := ctx.Deadline(); ok {
		budget = d.Sub(s.cfg.Clock.Now())
	}
	wait, ok := s.bucket.take(budget)
	if !ok {
		return nil, status.Errorf(codes.ResourceExhausted,
			"pleg's CRI endpoint passes at most %g calls a second to the runtime; %s would wait %v, past its timeout", s.cfg.Rate, method, wait)
	}
	if wait > 0 {
		t := s.cfg.Clock.NewTimer(wait)
		defer t.Stop()
		select {
		case <-t.C():
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	select {
	case s.slots <- struct{}{}:
		return func() { <-s.slots }, nil
	case <-ctx.Done():
		return nil, status.Errorf(codes.ResourceExhausted,
			"pleg's CRI endpoint passes at most %d calls to the runtime at once; %s found no slot before its deadline: %v", s.cfg.MaxInFlight, method, ctx.Err())
	}
}

// passUnary passes one call to the runtime, bounded.
func passUnary[T any](s *Server, ctx context.Context, method string, call func(context.Context) (T, error)) (T, error) {
	var zero T
	if s.cfg.Runtime == nil || s.cfg.Images == nil {
		return zero, errNoUpstream
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	release, err := s.admit(ctx, method)
	if err != nil {
		return zero, err
	}
	defer release()
	s.cfg.Metrics.runtime.WithLabelValues(s.cfg.Flag, method).Inc()
	return call(ctx)
}

// passStream passes one streamed call to the runtime, bounded as a unary
// one (the whole stream within the timeout), sending what it receives.
func passStream[T any](s *Server, ctx context.Context, method string, open func(context.Context) (grpc.ServerStreamingClient[T], error), send func(*T) error) error {
	if s.cfg.Runtime == nil || s.cfg.Images == nil {
		return errNoUpstream
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	release, err := s.admit(ctx, method)
	if err != nil {
		return err
	}
	defer release()
	s.cfg.Metrics.runtime.WithLabelValues(s.cfg.Flag, method).Inc()
	in, err := open(ctx)
	if err != nil {
		return err
	}
	for {
		m, err := in.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := send(m); err != nil {
			return err
		}
	}
}

// Version is the runtime's, cached for VersionTTL, its name saying that
// pleg answers in front of it.
func (r *runtimeServer) Version(ctx context.Context, req *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	s := r.s
	s.vmu.Lock()
	v, at := s.version, s.versionT
	s.vmu.Unlock()
	if v != nil && s.cfg.Clock.Since(at) < s.cfg.VersionTTL {
		return v, nil
	}
	resp, err := passUnary(s, ctx, "Version", func(ctx context.Context) (*runtimeapi.VersionResponse, error) {
		return s.cfg.Runtime.Version(ctx, &runtimeapi.VersionRequest{Version: req.GetVersion()})
	})
	if err != nil {
		return nil, err
	}
	v = &runtimeapi.VersionResponse{Version: resp.GetVersion(), RuntimeName: resp.GetRuntimeName() + RuntimeNameSuffix,
		RuntimeVersion: resp.GetRuntimeVersion(), RuntimeApiVersion: resp.GetRuntimeApiVersion()}
	s.vmu.Lock()
	s.version, s.versionT = v, s.cfg.Clock.Now()
	s.vmu.Unlock()
	return v, nil
}

// RuntimeNameSuffix follows the runtime's name in Version's answer.
const RuntimeNameSuffix = " (through pleg's read-only CRI endpoint)"

// podLabel limits a stats filter's label selector to the caller's pod on a
// pod-scoped server; ok is false when the caller asked for another pod
// (the answer is then empty) or sees none.
func (s *Server) podLabel(ctx context.Context, sel map[string]string) (map[string]string, bool) {
	v := s.viewOf(ctx)
	if v.all {
		return sel, true
	}
	if v.pod == nil {
		return nil, false
	}
	uid := string(v.pod.UID)
	if got, ok := sel[cruntime.LabelPodUID]; ok && got != uid {
		return nil, false
	}
	out := map[string]string{cruntime.LabelPodUID: uid}
	for k, val := range sel {
		out[k] = val
	}
	return out, true
}

func (r *runtimeServer) ContainerStats(ctx context.Context, req *runtimeapi.ContainerStatsRequest) (*runtimeapi.ContainerStatsResponse, error) {
	s := r.s
	if _, _, ok := s.findContainer(s.viewOf(ctx), req.GetContainerId()); !ok && s.cfg.Scope != nil {
		return nil, status.Errorf(codes.NotFound, "pleg: no container %q in the caller's pod", req.GetContainerId())
	}
	return passUnary(s, ctx, "ContainerStats", func(ctx context.Context) (*runtimeapi.ContainerStatsResponse, error) {
		return s.cfg.Runtime.ContainerStats(ctx, req)
	})
}

func (r *runtimeServer) ListContainerStats(ctx context.Context, req *runtimeapi.ListContainerStatsRequest) (*runtimeapi.ListContainerStatsResponse, error) {
	s := r.s
	sel, ok := s.podLabel(ctx, req.GetFilter().GetLabelSelector())
	if !ok {
		return &runtimeapi.ListContainerStatsResponse{}, nil
	}
	f := &runtimeapi.ContainerStatsFilter{Id: req.GetFilter().GetId(), PodSandboxId: req.GetFilter().GetPodSandboxId(), LabelSelector: sel}
	return passUnary(s, ctx, "ListContainerStats", func(ctx context.Context) (*runtimeapi.ListContainerStatsResponse, error) {
		return s.cfg.Runtime.ListContainerStats(ctx, &runtimeapi.ListContainerStatsRequest{Filter: f})
	})
}

func (r *runtimeServer) StreamContainerStats(req *runtimeapi.StreamContainerStatsRequest, stream grpc.ServerStreamingServer[runtimeapi.StreamContainerStatsResponse]) error {
	s := r.s
	sel, ok := s.podLabel(stream.Context(), req.GetFilter().GetLabelSelector())
	if !ok {
		return nil
	}
	f := &runtimeapi.ContainerStatsFilter{Id: req.GetFilter().GetId(), PodSandboxId: req.GetFilter().GetPodSandboxId(), LabelSelector: sel}
	return passStream(s, stream.Context(), "StreamContainerStats", func(ctx context.Context) (grpc.ServerStreamingClient[runtimeapi.StreamContainerStatsResponse], error) {
		return s.cfg.Runtime.StreamContainerStats(ctx, &runtimeapi.StreamContainerStatsRequest{Filter: f})
	}, stream.Send)
}

func (r *runtimeServer) PodSandboxStats(ctx context.Context, req *runtimeapi.PodSandboxStatsRequest) (*runtimeapi.PodSandboxStatsResponse, error) {
	s := r.s
	if _, _, ok := s.findSandbox(s.viewOf(ctx), req.GetPodSandboxId()); !ok && s.cfg.Scope != nil {
		return nil, status.Errorf(codes.NotFound, "pleg: no pod sandbox %q in the caller's pod", req.GetPodSandboxId())
	}
	return passUnary(s, ctx, "PodSandboxStats", func(ctx context.Context) (*runtimeapi.PodSandboxStatsResponse, error) {
		return s.cfg.Runtime.PodSandboxStats(ctx, req)
	})
}

func (r *runtimeServer) ListPodSandboxStats(ctx context.Context, req *runtimeapi.ListPodSandboxStatsRequest) (*runtimeapi.ListPodSandboxStatsResponse, error) {
	s := r.s
	sel, ok := s.podLabel(ctx, req.GetFilter().GetLabelSelector())
	if !ok {
		return &runtimeapi.ListPodSandboxStatsResponse{}, nil
	}
	f := &runtimeapi.PodSandboxStatsFilter{Id: req.GetFilter().GetId(), LabelSelector: sel}
	return passUnary(s, ctx, "ListPodSandboxStats", func(ctx context.Context) (*runtimeapi.ListPodSandboxStatsResponse, error) {
		return s.cfg.Runtime.ListPodSandboxStats(ctx, &runtimeapi.ListPodSandboxStatsRequest{Filter: f})
	})
}

func (r *runtimeServer) StreamPodSandboxStats(req *runtimeapi.StreamPodSandboxStatsRequest, stream grpc.ServerStreamingServer[runtimeapi.StreamPodSandboxStatsResponse]) error {
	s := r.s
	sel, ok := s.podLabel(stream.Context(), req.GetFilter().GetLabelSelector())
	if !ok {
		return nil
	}
	f := &runtimeapi.PodSandboxStatsFilter{Id: req.GetFilter().GetId(), LabelSelector: sel}
	return passStream(s, stream.Context(), "StreamPodSandboxStats", func(ctx context.Context) (grpc.ServerStreamingClient[runtimeapi.StreamPodSandboxStatsResponse], error) {
		return s.cfg.Runtime.StreamPodSandboxStats(ctx, &runtimeapi.StreamPodSandboxStatsRequest{Filter: f})
	}, stream.Send)
}

func (r *runtimeServer) ListMetricDescriptors(ctx context.Context, req *runtimeapi.ListMetricDescriptorsRequest) (*runtimeapi.ListMetricDescriptorsResponse, error) {
	s := r.s
	return passUnary(s, ctx, "ListMetricDescriptors", func(ctx context.Context) (*runtimeapi.ListMetricDescriptorsResponse, error) {
		return s.cfg.Runtime.ListMetricDescriptors(ctx, req)
	})
}

func (r *runtimeServer) ListPodSandboxMetrics(ctx context.Context, req *runtimeapi.ListPodSandboxMetricsRequest) (*runtimeapi.ListPodSandboxMetricsResponse, error) {
	s := r.s
	if s.cfg.Scope != nil {
		return nil, s.scopeRefusal("ListPodSandboxMetrics")
	}
	return passUnary(s, ctx, "ListPodSandboxMetrics", func(ctx context.Context) (*runtimeapi.ListPodSandboxMetricsResponse, error) {
		return s.cfg.Runtime.ListPodSandboxMetrics(ctx, req)
	})
}

func (r *runtimeServer) StreamPodSandboxMetrics(req *runtimeapi.StreamPodSandboxMetricsRequest, stream grpc.ServerStreamingServer[runtimeapi.StreamPodSandboxMetricsResponse]) error {
	s := r.s
	if s.cfg.Scope != nil {
		return s.scopeRefusal("StreamPodSandboxMetrics")
	}
	return passStream(s, stream.Context(), "StreamPodSandboxMetrics", func(ctx context.Context) (grpc.ServerStreamingClient[runtimeapi.StreamPodSandboxMetricsResponse], error) {
		return s.cfg.Runtime.StreamPodSandboxMetrics(ctx, req)
	}, stream.Send)
}

func (r *runtimeServer) RuntimeConfig(ctx context.Context, req *runtimeapi.RuntimeConfigRequest) (*runtimeapi.RuntimeConfigResponse, error) {
	s := r.s
	return passUnary(s, ctx, "RuntimeConfig", func(ctx context.Context) (*runtimeapi.RuntimeConfigResponse, error) {
		return s.cfg.Runtime.RuntimeConfig(ctx, req)
	})
}

// imageServer is runtime.v1.ImageService: read calls passed through
// (refused on a pod-scoped server: images are the node's), the others
// refused by the guarded service description.
type imageServer struct {
	runtimeapi.UnimplementedImageServiceServer
	s *Server
}

func (r *imageServer) ListImages(ctx context.Context, req *runtimeapi.ListImagesRequest) (*runtimeapi.ListImagesResponse, error) {
	s := r.s
	if s.cfg.Scope != nil {
		return nil, s.scopeRefusal("ListImages")
	}
	return passUnary(s, ctx, "ListImages", func(ctx context.Context) (*runtimeapi.ListImagesResponse, error) {
		return s.cfg.Images.ListImages(ctx, req)
	})
}

func (r *imageServer) StreamImages(req *runtimeapi.StreamImagesRequest, stream grpc.ServerStreamingServer[runtimeapi.StreamImagesResponse]) error {
	s := r.s
	if s.cfg.Scope != nil {
		return s.scopeRefusal("StreamImages")
	}
	return passStream(s, stream.Context(), "StreamImages", func(ctx context.Context) (grpc.ServerStreamingClient[runtimeapi.StreamImagesResponse], error) {
		return s.cfg.Images.StreamImages(ctx, req)
	}, stream.Send)
}

func (r *imageServer) ImageStatus(ctx context.Context, req *runtimeapi.ImageStatusRequest) (*runtimeapi.ImageStatusResponse, error) {
	s := r.s
	if s.cfg.Scope != nil {
		return nil, s.scopeRefusal("ImageStatus")
	}
	return passUnary(s, ctx, "ImageStatus", func(ctx context.Context) (*runtimeapi.ImageStatusResponse, error) {
		return s.cfg.Images.ImageStatus(ctx, req)
	})
}

func (r *imageServer) ImageFsInfo(ctx context.Context, req *runtimeapi.ImageFsInfoRequest) (*runtimeapi.ImageFsInfoResponse, error) {
	s := r.s
	if s.cfg.Scope != nil {
		return nil, s.scopeRefusal("ImageFsInfo")
	}
	return passUnary(s, ctx, "ImageFsInfo", func(ctx context.Context) (*runtimeapi.ImageFsInfoResponse, error) {
		return s.cfg.Images.ImageFsInfo(ctx, req)
	})
}
