package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/podlifecycle/pleg/api/lifecycle/client"
	lifecyclev1 "github.com/podlifecycle/pleg/api/lifecycle/v1"
	"github.com/podlifecycle/pleg/cruntime/sim"
)

var lifecycleRE = regexp.MustCompile(`"serving the lifecycle API \(gRPC\) on ([^"]+)"`)

// waitLifecycle reads pleg run's stderr until it has named n lifecycle
// API addresses, and returns them.
func (p *proc) waitLifecycle(n int) []string {
	p.t.Helper()
	var addrs []string
	deadline := time.After(patience)
	for len(addrs) < n {
		select {
		case l, ok := <-p.errCh:
			if !ok {
				p.t.Fatal("pleg exited before serving the lifecycle API")
			}
			if m := lifecycleRE.FindStringSubmatch(l); m != nil {
				addrs = append(addrs, m[1])
			}
		case <-deadline:
			p.t.Fatalf("no lifecycle API line within %v", patience)
		}
	}
	return addrs
}

// waitStderr reads stderr until a line containing sub.
func (p *proc) waitStderr(sub string) {
	p.t.Helper()
	deadline := time.After(patience)
	for {
		select {
		case l, ok := <-p.errCh:
			if !ok {
				p.t.Fatalf("pleg exited before logging %q", sub)
			}
			if strings.Contains(l, sub) {
				return
			}
		case <-deadline:
			p.t.Fatalf("no %q line within %v", sub, patience)
		}
	}
}

// pleg run against the simulated runtime serves the lifecycle API on its
// unix socket (mode 0660 by default) and on loopback TCP: the Go client
// gets the snapshot, then the runtime's changes; lookups and the gRPC
// health service answer.
func TestRunLifecycleAPI(t *testing.T) {
	r := serveSim(t, sim.Config{Seed: 7})
	pod, err := r.AddPod(sim.PodSpec{Name: "web-0", Namespace: "prod", Containers: []string{"nginx"}})
	if err != nil {
		t.Fatal(err)
	}
	nginx, _ := pod.Container("nginx")
	sock := filepath.Join(t.TempDir(), "run", "pleg.sock")
	p := startPleg(t, "run", "-r", r.Endpoint(), "--listen-address", "127.0.0.1:0", "--relist-period", "100ms",
		"--lifecycle-socket", sock, "--lifecycle-tcp-address", "127.0.0.1:0")
	p.waitListening()
	addrs := p.waitLifecycle(2)
	if addrs[0] != "unix://"+sock || !strings.HasPrefix(addrs[1], "127.0.0.1:") {
		t.Fatalf("lifecycle API on %v", addrs)
	}
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o660 {
		t.Fatalf("socket %v %v, want mode 0660", fi, err)
	}

	type got struct {
		pods  []*lifecyclev1.Pod
		event *lifecyclev1.PodEvent
	}
	calls := make(chan got, 100)
	c, err := client.New(client.Options{Address: sock})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- c.Run(ctx, client.HandlerFuncs{
			Resync: func(pods []*lifecyclev1.Pod, _ client.Position) { calls <- got{pods: pods} },
			Event:  func(ev *lifecyclev1.PodEvent, _ client.Position) { calls <- got{event: ev} },
		})
	}()
	defer func() {
		cancel()
		<-done
	}()
	next := func() got {
		t.Helper()
		select {
		case g := <-calls:
			return g
		case <-time.After(patience):
			t.Fatal("no handler call")
		}
		return got{}
	}
	// The snapshot may precede pleg's first relist: events bring it up
	// to the runtime's state.
	first := next()
	running := len(first.pods) == 1 && len(first.pods[0].GetContainers()) == 1
	for !running {
		g := next()
		running = g.event != nil && g.event.GetPod().GetName() == "web-0" && len(g.event.GetPod().GetContainers()) == 1 &&
			g.event.GetPod().GetContainers()[0].GetState() == lifecyclev1.State_STATE_RUNNING
	}
	if err := r.ExitContainer(nginx.ID, 3); err != nil {
		t.Fatal(err)
	}
	for {
		g := next()
		if g.event == nil || len(g.event.GetTransitions()) == 0 || g.event.GetTransitions()[0].GetType() != lifecyclev1.EventType_CONTAINER_DIED {
			continue
		}
		if tr := g.event.GetTransitions()[0]; tr.GetContainerId() != nginx.ID || tr.GetExitCode() != 3 {
			t.Fatalf("ContainerDied: %v", tr)
		}
		break
	}
	gc, err := c.API().GetContainer(ctx, &lifecyclev1.GetContainerRequest{Id: nginx.ID})
	if err != nil || gc.GetContainer().GetExitCode() != 3 || gc.GetPod().GetNamespace() != "prod" {
		t.Fatalf("GetContainer: %v %v", gc, err)
	}

	conn, err := grpc.NewClient(addrs[1], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "pleg.lifecycle.v1.Lifecycle"})
	if err != nil || hc.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health over TCP: %v %v", hc, err)
	}
	if !strings.Contains(p.stderr(), "Lifecycle API client connected") {
		t.Error("the client's connection was not logged")
	}
	if code := p.stop(); code != 0 {
		t.Errorf("exit code %d", code)
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("the socket outlived pleg: %v", err)
	}
}

// pleg watch --daemon prints a running pleg's events from its lifecycle
// socket; when that pleg restarts, it reconnects, resyncs (stderr says
// so) and goes on printing the new instance's events.
func TestWatchDaemon(t *testing.T) {
	r := serveSim(t, sim.Config{Seed: 7})
	sock := filepath.Join(t.TempDir(), "pleg.sock")
	runArgs := []string{"run", "-r", r.Endpoint(), "--listen-address", "127.0.0.1:0", "--relist-period", "100ms", "--lifecycle-socket", sock}
	daemon := startPleg(t, runArgs...)
	daemon.waitListening()
	daemon.waitLifecycle(1)
	w := startPleg(t, "watch", "--daemon", sock, "-o", "json", "-v=1")
	w.waitStderr("Watching pleg's lifecycle stream") // its snapshot came: what follows are events

	// nextEvent returns the next printed event of type typ for pod name.
	nextEvent := func(typ, name string) jsonEvent {
		t.Helper()
		for {
			e := parseJSONEvent(t, w.nextLine(patience))
			if e.Type == typ && e.PodName == name {
				return e
			}
		}
	}
	a, err := r.AddPod(sim.PodSpec{Name: "a", Namespace: "prod", Containers: []string{"app"}})
	if err != nil {
		t.Fatal(err)
	}
	app, _ := a.Container("app")
	if e := nextEvent("ContainerStarted", "a"); e.PodNamespace != "prod" {
		t.Fatalf("event %+v", e)
	}
	if err := r.ExitContainer(app.ID, 3); err != nil {
		t.Fatal(err)
	}
	if e := nextEvent("ContainerDied", "a"); e.ContainerID != app.ID || e.ExitCode == nil || *e.ExitCode != 3 {
		t.Fatalf("ContainerDied %+v", e)
	}

	if code := daemon.stop(); code != 0 {
		t.Fatalf("pleg run exit code %d", code)
	}
	restarted := startPleg(t, runArgs...)
	restarted.waitListening()
	// The new instance answers the watch's cursor with resync_required:
	// what changed meanwhile comes as the snapshot, not as events.
	w.waitStderr("pleg asked for a resync")
	b, err := r.AddPod(sim.PodSpec{Name: "b", Namespace: "prod", Containers: []string{"app"}})
	if err != nil {
		t.Fatal(err)
	}
	bapp, _ := b.Container("app")
	if err := r.ExitContainer(bapp.ID, 4); err != nil {
		t.Fatal(err)
	}
	if e := nextEvent("ContainerDied", "b"); e.ExitCode == nil || *e.ExitCode != 4 {
		t.Fatalf("after the restart: %+v", e)
	}
	if code := w.stop(); code != 0 {
		t.Errorf("pleg watch exit code %d", code)
	}
}
