package main

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podlifecycle/pleg/cruntime"
	"github.com/podlifecycle/pleg/cruntime/sim"
)

// simulateConfig parses the simulate flags args and returns the
// runtime configuration they make.
func simulateConfig(t *testing.T, args ...string) (sim.Config, error) {
	t.Helper()
	o := &simulateOptions{}
	fs := pflag.NewFlagSet("simulate", pflag.ContinueOnError)
	o.addFlags(fs)
	if err := fs.Parse(args); err != nil {
		return sim.Config{}, usageError{err} // as the root command's flag error function makes it
	}
	return o.config()
}

func TestSimulateFaultFlags(t *testing.T) {
	cfg, err := simulateConfig(t, "--pods", "110", "--containers-per-pod", "5", "--hang-pods", "1", "--hang-pod-lists",
		"--events-for-hung-pods", "20ms", "--event-storm", "3000", "--keep-events", "5m", "--replay-events", "100", "--replay-event-age", "2m")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Pods != 110 || cfg.ContainersPerPod != 5 || cfg.HangPods != 1 || !cfg.HangLists || cfg.HungPodEvents != 20*time.Millisecond ||
		cfg.EventStorm != 3000 || cfg.KeepEvents != 5*time.Minute || cfg.ReplayEvents != 100 || cfg.ReplayAge != 2*time.Minute {
		t.Errorf("config %+v", cfg)
	}
	// The defaults inject none of them.
	cfg, err = simulateConfig(t)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.HangLists || cfg.HungPodEvents != 0 || cfg.EventStorm != 0 || cfg.KeepEvents != 0 || cfg.ReplayEvents != 0 || cfg.ReplayAge != sim.DefaultReplayAge {
		t.Errorf("default config %+v", cfg)
	}
	for _, args := range [][]string{
		{"--hang-pod-lists"},               // no hung pod
		{"--events-for-hung-pods", "20ms"}, // no hung pod
		{"--hang-pods", "1", "--events-for-hung-pods", "-1ms"},
		{"--event-storm", "-5"},
		{"--replay-events", "-1"},
		{"--replay-event-age", "0s"},
		{"--keep-events", "-1m"},
		{"--events=false", "--event-storm", "100"},
		{"--events=false", "--replay-events", "1"},
	} {
		_, err := simulateConfig(t, args...)
		var ue usageError
		if !errors.As(err, &ue) {
			t.Errorf("%v: error %v, want a usage error", args, err)
		}
	}
}

func TestSimulateHungPodProcess(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "sim.sock")
	p := startPleg(t, "simulate", "--listen", "unix://"+sock, "--pods", "3", "--containers-per-pod", "2", "--churn", "0",
		"--hang-pods", "1", "--hang-pod-lists", "--events-for-hung-pods", "10ms",
		"--replay-events", "2", "--replay-event-age", "3m")
	if l := p.nextLine(patience); !strings.Contains(l, "listening on unix://"+sock) {
		t.Fatalf("first line %q", l)
	}
	l := p.nextLine(patience)
	uid, what, ok := strings.Cut(strings.TrimPrefix(l, "hung pod "), ": ")
	if !ok || !strings.HasPrefix(l, "hung pod ") || what != "status calls and filtered list calls hang; an event every 10ms" {
		t.Fatalf("hung pod line %q", l)
	}

	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := runtimeapi.NewRuntimeServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 2*patience)
	defer cancel()

	all, err := c.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil || len(all.Items) != 3 {
		t.Fatalf("unfiltered list: %d sandboxes, %v", len(all.GetItems()), err)
	}
	short, cancelShort := context.WithTimeout(ctx, 50*time.Millisecond)
	_, err = c.ListContainers(short, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
		LabelSelector: map[string]string{cruntime.LabelPodUID: uid}}})
	cancelShort()
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("list filtered to the hung pod: %v, want DeadlineExceeded", err)
	}

	// A new subscriber gets the two replayed events, 3 minutes old, then
	// the hung pod's events, new.
	stream, err := c.GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		ev, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		age := time.Since(time.Unix(0, ev.CreatedAt))
		if i < 2 {
			if age < 3*time.Minute {
				t.Errorf("replayed event %d is %v old, want 3m", i, age)
			}
			continue
		}
		if age >= 3*time.Minute || ev.PodSandboxStatus.GetMetadata().GetUid() != uid {
			t.Errorf("event %d: pod %s, %v old; want the hung pod %s, new", i, ev.PodSandboxStatus.GetMetadata().GetUid(), age, uid)
		}
	}
	if code := p.stop(); code != 0 {
		t.Errorf("simulate exited with %d", code)
	}
}

func TestSimulateHangAfter(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "sim.sock")
	p := startPleg(t, "simulate", "--listen", "unix://"+sock, "--pods", "2", "--churn", "0",
		"--hang-pods", "1", "--hang-pod-lists", "--hang-after", "100ms")
	if l := p.nextLine(patience); !strings.Contains(l, "listening on") {
		t.Fatalf("first line %q", l)
	}
	// The faults come later, announced by their line.
	l := p.nextLine(patience)
	uid, what, _ := strings.Cut(strings.TrimPrefix(l, "hung pod "), ": ")
	if !strings.HasPrefix(l, "hung pod ") || what != "status calls and filtered list calls hang" {
		t.Fatalf("hung pod line %q", l)
	}
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := runtimeapi.NewRuntimeServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err = c.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{
		LabelSelector: map[string]string{cruntime.LabelPodUID: uid}}})
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("list filtered to the hung pod after --hang-after: %v, want DeadlineExceeded", err)
	}
	if code := p.stop(); code != 0 {
		t.Errorf("simulate exited with %d", code)
	}
}
