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
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podlifecycle/pleg/cruntime/sim"
)

var criRE = regexp.MustCompile(`"serving a read-only CRI endpoint on unix://([^"]+)"`)

// waitCRI reads pleg run's stderr until it has named n CRI endpoints.
func (p *proc) waitCRI(n int) []string {
	p.t.Helper()
	var socks []string
	deadline := time.After(patience)
	for len(socks) < n {
		select {
		case l, ok := <-p.errCh:
			if !ok {
				p.t.Fatal("pleg exited before serving its CRI endpoints")
			}
			if m := criRE.FindStringSubmatch(l); m != nil {
				socks = append(socks, m[1])
			}
		case <-deadline:
			p.t.Fatalf("no CRI endpoint line within %v", patience)
		}
	}
	return socks
}

// pleg run --cri-socket serves the runtime's pods read-only: a listing
// equal to the simulator's, writes refused naming the flag; the socket
// has its mode; --cri-pod-socket shows this test (in no pod) nothing.
func TestRunCRISocket(t *testing.T) {
	r := serveSim(t, sim.Config{Seed: 7, Pods: 3, ContainersPerPod: 2})
	dir := t.TempDir()
	sock, podSock := filepath.Join(dir, "cri.sock"), filepath.Join(dir, "cri-pod.sock")
	p := startPleg(t, "run", "-r", r.Endpoint(), "--listen-address", "127.0.0.1:0", "--relist-period", "100ms",
		"--cri-socket", sock, "--cri-socket-mode", "0600", "--cri-pod-socket", podSock)
	p.waitListening()
	if got := p.waitCRI(2); got[0] != sock || got[1] != podSock {
		t.Fatalf("CRI endpoints on %v, want %s and %s", got, sock, podSock)
	}
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("--cri-socket %v %v, want mode 0600", fi, err)
	}
	if fi, err := os.Stat(podSock); err != nil || fi.Mode().Perm() != 0o666 {
		t.Fatalf("--cri-pod-socket %v %v, want mode 0666", fi, err)
	}
	dial := func(path string) runtimeapi.RuntimeServiceClient {
		conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return runtimeapi.NewRuntimeServiceClient(conn)
	}
	c, pc, direct := dial(sock), dial(podSock), dial(strings.TrimPrefix(r.Endpoint(), "unix://"))
	ctx := context.Background()
	want, err := direct.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	ids := func(cs []*runtimeapi.Container) map[string]runtimeapi.ContainerState {
		m := map[string]runtimeapi.ContainerState{}
		for _, c := range cs {
			m[c.GetId()] = c.GetState()
		}
		return m
	}
	deadline := time.Now().Add(patience)
	for {
		got, err := c.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
		if err != nil {
			t.Fatal(err)
		}
		g, w := ids(got.GetContainers()), ids(want.GetContainers())
		if len(g) == len(w) && len(w) == 6 {
			for id, st := range w {
				if g[id] != st {
					t.Errorf("container %s: %v through pleg, %v in the runtime", id, g[id], st)
				}
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pleg lists %d containers, the runtime %d", len(g), len(w))
		}
		time.Sleep(20 * time.Millisecond)
	}
	v, err := c.Version(ctx, &runtimeapi.VersionRequest{})
	if err != nil || !strings.HasPrefix(v.GetRuntimeName(), sim.RuntimeName) || !strings.Contains(v.GetRuntimeName(), "pleg") {
		t.Errorf("Version: %v %v, want the simulator's name and pleg's", v, err)
	}
	r.ResetCalls()
	_, err = c.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: want.GetContainers()[0].GetId()})
	if st, _ := status.FromError(err); st.Code() != codes.PermissionDenied || !strings.Contains(st.Message(), "--cri-socket") {
		t.Errorf("RemoveContainer: %v, want PermissionDenied naming --cri-socket", err)
	}
	if n := r.Calls()["RemoveContainer"]; n != 0 {
		t.Errorf("the runtime had %d RemoveContainer calls", n)
	}
	// This test runs in no pod: the pod-scoped endpoint shows nothing.
	got, err := pc.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if err != nil || len(got.GetContainers()) != 0 {
		t.Errorf("the pod-scoped endpoint showed a caller in no pod %d containers (%v)", len(got.GetContainers()), err)
	}
	if code := p.stop(); code != 0 {
		t.Errorf("exit code %d", code)
	}
	for _, s := range []string{sock, podSock} {
		if _, err := os.Stat(s); !os.IsNotExist(err) {
			t.Errorf("%s outlived pleg: %v", s, err)
		}
	}
}
