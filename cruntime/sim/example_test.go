package sim_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podlifecycle/pleg/cruntime/sim"
)

func Example() {
	dir, err := os.MkdirTemp("", "sim")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)

	r := sim.New(sim.Config{Seed: 42})
	if err := r.Serve(filepath.Join(dir, "cri.sock")); err != nil {
		panic(err)
	}
	defer r.Stop()
	pod, err := r.AddPod(sim.PodSpec{Name: "web", Namespace: "prod", Containers: []string{"app", "proxy"}})
	if err != nil {
		panic(err)
	}

	conn, err := grpc.NewClient(r.Endpoint(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	client := runtimeapi.NewRuntimeServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	v, err := client.Version(ctx, &runtimeapi.VersionRequest{})
	if err != nil {
		panic(err)
	}
	fmt.Println(v.RuntimeName)

	// A crash: the container exits, then a new attempt starts with a new ID.
	app, _ := pod.Container("app")
	_ = r.ExitContainer(app.ID, 1)
	newID, _ := r.RestartContainer(pod.UID, "app")

	list, err := client.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
		LabelSelector: map[string]string{"io.kubernetes.container.name": "app"},
	}})
	if err != nil {
		panic(err)
	}
	for _, c := range list.Containers {
		fmt.Println(c.Metadata.Name, c.Metadata.Attempt, c.State, c.Id == newID)
	}
	// Output:
	// pleg-sim
	// app 0 CONTAINER_EXITED false
	// app 1 CONTAINER_RUNNING true
}
