package cri

import (
	"context"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// discardReply counts the bytes of a reply the codec does not decode.
type discardReply int

// ListDiscard makes a listing's two calls, ListPodSandbox and
// ListContainers unfiltered, on the client's connection and through its
// codec and buffers, and discards the replies undecoded: it returns their
// size in bytes. What it costs is the transport's share of a listing, the
// floor under ListPods that no decoding can go below; benchmarks measure
// it beside the relists. Each call is bounded by the client's timeout; no
// metric counts them.
func (c *Client) ListDiscard(ctx context.Context) (int, error) {
	var n discardReply
	for _, call := range []struct {
		method string
		req    any
	}{
		{runtimeapi.RuntimeService_ListPodSandbox_FullMethodName, &runtimeapi.ListPodSandboxRequest{}},
		{runtimeapi.RuntimeService_ListContainers_FullMethodName, &runtimeapi.ListContainersRequest{}},
	} {
		cctx, cancel := context.WithTimeout(ctx, c.timeout)
		err := c.conn.Invoke(cctx, call.method, call.req, &n, grpc.ForceCodecV2(leanCodec{}))
		cancel()
		if err != nil {
			return int(n), err
		}
	}
	return int(n), nil
}
