package cri

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// No runtime at the socket: Unavailable, and the CallError names why.
func TestDirectNoRuntime(t *testing.T) {
	sock := filepath.Join(socketDir(t), "none.sock")
	c, err := Dial("unix://" + sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err = c.ListPods(ctx)
	var ce *CallError
	if status.Code(err) != codes.Unavailable || !errors.As(err, &ce) || ce.Unreachable == nil {
		t.Fatalf("error %v; want Unavailable with the socket's dial error", err)
	}
}
