package sim

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	plegruntime "github.com/podlifecycle/pleg/cruntime"
)

func TestVersionAndStatus(t *testing.T) {
	r, c := newSim(t, Config{})
	ctx := ctxT(t)
	v, err := c.Version(ctx, &runtimeapi.VersionRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if v.RuntimeName != "pleg-sim" || v.RuntimeApiVersion != "v1" {
		t.Errorf("version = %+v", v)
	}
	st, err := c.Status(ctx, &runtimeapi.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	conds := map[string]*runtimeapi.RuntimeCondition{}
	for _, cond := range st.Status.Conditions {
		conds[cond.Type] = cond
	}
	if !conds[plegruntime.RuntimeReady].GetStatus() || !conds[plegruntime.NetworkReady].GetStatus() {
		t.Errorf("conditions = %v", st.Status.Conditions)
	}
	r.SetRuntimeReady(false, "ShimDown", "containerd-shim is gone")
	st, err = c.Status(ctx, &runtimeapi.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	got := st.Status.Conditions[0]
	if got.Type != plegruntime.RuntimeReady || got.Status || got.Reason != "ShimDown" || got.Message == "" {
		t.Errorf("RuntimeReady = %v", got)
	}
}

func TestListFiltersAndPayloads(t *testing.T) {
	clk := fakeClock()
	r, c := newSim(t, Config{Clock: clk})
	ctx := ctxT(t)
	a := mustAdd(t, r, PodSpec{Name: "a", Namespace: "prod", Containers: []string{"app", "proxy"}})
	b := mustAdd(t, r, PodSpec{Name: "b", Containers: []string{"app"}, CreatedOnly: true, HostNetwork: true})
	aApp, _ := a.Container("app")
	if err := r.ExitContainer(aApp.ID, 3); err != nil {
		t.Fatal(err)
	}

	sbs, err := c.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(sbs.Items) != 2 {
		t.Fatalf("%d sandboxes, want 2", len(sbs.Items))
	}
	s0 := sbs.Items[0]
	if s0.Id != a.SandboxID() || s0.Metadata.Name != "a" || s0.Metadata.Uid != a.UID || s0.Metadata.Namespace != "prod" ||
		s0.Labels[plegruntime.LabelPodUID] != a.UID || s0.Labels[plegruntime.LabelPodName] != "a" ||
		s0.Labels[plegruntime.LabelPodNamespace] != "prod" || s0.CreatedAt != epoch.UnixNano() || len(s0.Id) != 64 {
		t.Errorf("sandbox = %v", s0)
	}

	listSB := func(f *runtimeapi.PodSandboxFilter) []string {
		t.Helper()
		resp, err := c.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: f})
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, it := range resp.Items {
			ids = append(ids, it.Id)
		}
		return ids
	}
	if got := listSB(&runtimeapi.PodSandboxFilter{Id: b.SandboxID()}); len(got) != 1 || got[0] != b.SandboxID() {
		t.Errorf("filter by id: %v", got)
	}
	if got := listSB(&runtimeapi.PodSandboxFilter{LabelSelector: map[string]string{plegruntime.LabelPodUID: a.UID}}); len(got) != 1 || got[0] != a.SandboxID() {
		t.Errorf("filter by label: %v", got)
	}
	if err := r.StopPod(b.UID); err != nil {
		t.Fatal(err)
	}
	if got := listSB(&runtimeapi.PodSandboxFilter{State: &runtimeapi.PodSandboxStateValue{State: runtimeapi.PodSandboxState_SANDBOX_NOTREADY}}); len(got) != 1 || got[0] != b.SandboxID() {
		t.Errorf("filter by state: %v", got)
	}

	listC := func(f *runtimeapi.ContainerFilter) []*runtimeapi.Container {
		t.Helper()
		resp, err := c.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: f})
		if err != nil {
			t.Fatal(err)
		}
		return resp.Containers
	}
	all := listC(nil)
	if len(all) != 3 {
		t.Fatalf("%d containers, want 3", len(all))
	}
	c0 := all[0]
	if c0.Id != aApp.ID || c0.PodSandboxId != a.SandboxID() || c0.Metadata.Name != "app" || c0.Metadata.Attempt != 0 ||
		c0.Labels[plegruntime.LabelContainerName] != "app" || c0.Labels[plegruntime.LabelPodUID] != a.UID ||
		c0.Image.GetImage() == "" || !strings.HasPrefix(c0.ImageRef, "sha256:") || c0.State != runtimeapi.ContainerState_CONTAINER_EXITED {
		t.Errorf("container = %v", c0)
	}
	running := listC(&runtimeapi.ContainerFilter{State: &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING}})
	if len(running) != 1 || running[0].Metadata.Name != "proxy" {
		t.Errorf("running = %v", running)
	}
	if got := listC(&runtimeapi.ContainerFilter{PodSandboxId: b.SandboxID()}); len(got) != 1 || got[0].Labels[plegruntime.LabelPodName] != "b" {
		t.Errorf("by sandbox = %v", got)
	}
	if got := listC(&runtimeapi.ContainerFilter{Id: aApp.ID}); len(got) != 1 || got[0].Id != aApp.ID {
		t.Errorf("by id = %v", got)
	}
	if got := listC(&runtimeapi.ContainerFilter{LabelSelector: map[string]string{plegruntime.LabelContainerName: "app"}}); len(got) != 2 {
		t.Errorf("by label = %v", got)
	}
	if got := listC(&runtimeapi.ContainerFilter{Id: aApp.ID, PodSandboxId: b.SandboxID()}); len(got) != 0 {
		t.Errorf("contradictory filter = %v", got)
	}

	// Full statuses.
	ps, err := c.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: a.SandboxID()})
	if err != nil {
		t.Fatal(err)
	}
	if ip := ps.Status.GetNetwork().GetIp(); !strings.HasPrefix(ip, "10.88.") || ps.Status.Metadata.GetUid() != a.UID ||
		ps.Status.Linux.GetNamespaces().GetOptions().GetNetwork() != runtimeapi.NamespaceMode_POD || len(ps.ContainersStatuses) != 2 {
		t.Errorf("sandbox status = %v", ps)
	}
	ps, err = c.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: b.SandboxID()})
	if err != nil {
		t.Fatal(err)
	}
	if ps.Status.State != runtimeapi.PodSandboxState_SANDBOX_NOTREADY || ps.Status.GetNetwork().GetIp() != "" ||
		ps.Status.Linux.GetNamespaces().GetOptions().GetNetwork() != runtimeapi.NamespaceMode_NODE {
		t.Errorf("host network, stopped sandbox status = %v", ps.Status)
	}
	cs, err := c.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: aApp.ID})
	if err != nil {
		t.Fatal(err)
	}
	s := cs.Status
	if s.ExitCode != 3 || s.Reason != "Error" || s.State != runtimeapi.ContainerState_CONTAINER_EXITED ||
		s.CreatedAt != epoch.UnixNano() || s.StartedAt != epoch.UnixNano() || s.FinishedAt != epoch.UnixNano() ||
		!strings.Contains(s.ImageRef, "@sha256:") || s.Metadata.GetName() != "app" || s.Labels[plegruntime.LabelPodUID] != a.UID {
		t.Errorf("container status = %v", s)
	}
	bApp, _ := b.Container("app")
	cs, err = c.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: bApp.ID})
	if err != nil {
		t.Fatal(err)
	}
	if cs.Status.ExitCode != 0 || cs.Status.Reason != "Completed" || cs.Status.StartedAt != 0 {
		t.Errorf("stopped created-only container = %v", cs.Status)
	}
}

func TestNotFound(t *testing.T) {
	r, c := newSim(t, Config{})
	ctx := ctxT(t)
	const id = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	_, err := c.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: id})
	wantCode(t, err, codes.NotFound)
	_, err = c.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
	wantCode(t, err, codes.NotFound)
	_, err = c.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id})
	wantCode(t, err, codes.NotFound)
	_, err = c.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id})
	wantCode(t, err, codes.NotFound)
	_, err = c.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: id})
	wantCode(t, err, codes.NotFound)
	_, err = c.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: id})
	wantCode(t, err, codes.NotFound)
	_, err = c.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: id})
	wantCode(t, err, codes.NotFound)
	_, err = c.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: id, Config: &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: "x"}}})
	wantCode(t, err, codes.NotFound)
	// An unimplemented method.
	_, err = c.ExecSync(ctx, &runtimeapi.ExecSyncRequest{ContainerId: id})
	wantCode(t, err, codes.Unimplemented)

	for _, err := range []error{r.ExitContainer(id, 1), r.StartContainer(id), r.RemoveContainer(id), r.StopPod("nope"), r.RemovePod("nope")} {
		if !errors.Is(err, ErrNotFound) {
			t.Errorf("direct API error %v, want ErrNotFound", err)
		}
	}
	if _, err := r.RestartContainer("nope", "app"); !errors.Is(err, ErrNotFound) {
		t.Errorf("RestartContainer: %v", err)
	}
	// A removed container is NotFound too.
	p := mustAdd(t, r, PodSpec{Containers: []string{"app"}})
	if err := r.RemoveContainer(p.Containers[0].ID); err != nil {
		t.Fatal(err)
	}
	_, err = c.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: p.Containers[0].ID})
	wantCode(t, err, codes.NotFound)
}

func TestCRILifecycle(t *testing.T) {
	r, c := newSim(t, Config{})
	ctx := ctxT(t)
	sbCfg := &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: "nginx", Uid: "uid-1", Namespace: "default", Attempt: 0},
		Labels:   map[string]string{"app": "nginx"},
	}
	run, err := c.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: sbCfg})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: &runtimeapi.PodSandboxConfig{}})
	wantCode(t, err, codes.InvalidArgument)
	cc := &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: "web", Attempt: 0},
		Image:    &runtimeapi.ImageSpec{Image: "docker.io/library/nginx:1.27"},
		Labels:   map[string]string{"extra": "yes"},
	}
	created, err := c.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: run.PodSandboxId, Config: cc, SandboxConfig: sbCfg})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: run.PodSandboxId, Config: cc})
	wantCode(t, err, codes.AlreadyExists)
	if _, err := c.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: created.ContainerId}); err != nil {
		t.Fatal(err)
	}
	_, err = c.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: created.ContainerId})
	wantCode(t, err, codes.FailedPrecondition)

	p, ok := r.Pod("uid-1")
	if !ok || p.Name != "nginx" || len(p.Containers) != 1 || p.Containers[0].State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("pod = %+v", p)
	}
	list, err := c.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if l := list.Containers[0].Labels; l["extra"] != "yes" || l[plegruntime.LabelPodUID] != "uid-1" || l[plegruntime.LabelContainerName] != "web" {
		t.Errorf("labels = %v", l)
	}
	if _, err := c.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: created.ContainerId}); err != nil {
		t.Fatal(err)
	}
	if ci, _ := r.Container(created.ContainerId); ci.State != runtimeapi.ContainerState_CONTAINER_EXITED || ci.Reason != "Completed" {
		t.Errorf("stopped container = %+v", ci)
	}
	if _, err := c.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: run.PodSandboxId}); err != nil {
		t.Fatal(err)
	}
	_, err = c.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: run.PodSandboxId, Config: &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: "late"}}})
	wantCode(t, err, codes.FailedPrecondition)
	// A second sandbox attempt joins the same pod.
	sbCfg.Metadata.Attempt = 1
	run2, err := c.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: sbCfg})
	if err != nil {
		t.Fatal(err)
	}
	if p, _ := r.Pod("uid-1"); len(p.Sandboxes) != 2 || p.SandboxID() != run2.PodSandboxId || p.Sandboxes[1].Attempt != 1 {
		t.Errorf("pod after second sandbox = %+v", p)
	}
	for _, id := range []string{run.PodSandboxId, run2.PodSandboxId} {
		if _, err := c.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := r.Pod("uid-1"); ok {
		t.Error("pod still there after removing its sandboxes")
	}
	if got := r.Calls(); got["RunPodSandbox"] != 3 || got["CreateContainer"] != 3 || got["RemovePodSandbox"] != 2 {
		t.Errorf("calls = %v", got)
	}
	r.ResetCalls()
	if len(r.Calls()) != 0 {
		t.Error("ResetCalls left counters")
	}
}

func TestRecreateSandbox(t *testing.T) {
	r, c := newSim(t, Config{})
	ctx := ctxT(t)
	p := mustAdd(t, r, PodSpec{Containers: []string{"app"}})
	newSB, err := r.RecreateSandbox(p.UID)
	if err != nil {
		t.Fatal(err)
	}
	p, _ = r.Pod(p.UID)
	if len(p.Sandboxes) != 2 || p.SandboxID() != newSB || p.Sandboxes[0].State != runtimeapi.PodSandboxState_SANDBOX_NOTREADY ||
		p.Sandboxes[1].Attempt != 1 {
		t.Fatalf("sandboxes = %+v", p.Sandboxes)
	}
	app, _ := p.Container("app")
	if app.Attempt != 1 || app.SandboxID != newSB || app.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Errorf("new attempt = %+v", app)
	}
	resp, err := c.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil || len(resp.Items) != 2 {
		t.Fatalf("list: %v %v", resp, err)
	}
	// The workload's garbage collection removes the old sandbox later.
	r.Step()
	if p, _ = r.Pod(p.UID); len(p.Sandboxes) != 1 || len(p.Containers) != 1 {
		t.Errorf("after GC: %+v", p)
	}
}
