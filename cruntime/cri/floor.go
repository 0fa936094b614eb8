package cri

import (
	"context"

	"google.golang.org/grpc"

	"github.com/podlifecycle/pleg/cruntime/cri/directlist"
)

// discardReply counts the bytes of a reply the codec does not decode.
type discardReply int

// ListDiscard makes a listing's two calls, ListPodSandbox and
// ListContainers unfiltered, on the client's connection and through its
// codec and buffers, and discards the replies undecoded: it returns their
// size in bytes. What it costs is the transport's share of a listing, the
// floor under ListPods that no decoding can go below (through the direct
// connection, as ListPods lists, unless WithDirectLists(false)); benchmarks measure
// it beside the relists. Each call is bounded by the client's timeout, as
// every unary call is, and fails with a *CallError; no metric counts them.
func (c *Client) ListDiscard(ctx context.Context) (int, error) {
	var n discardReply
	for _, lc := range []listCall{listSandboxesCall, listContainersCall} {
		cctx, cancel := c.bound(ctx)
		var err error
		if c.direct != nil {
			_, err = c.direct.Call(cctx, lc.unary, lc.req, true, func(m *directlist.Message) error {
				n += discardReply(m.Left())
				m.Skip(m.Left()) // a failed read is in m.Err()
				return nil
			})
		} else {
			err = c.conn.Invoke(cctx, lc.unary, lc.req, &n, grpc.ForceCodecV2(leanCodec{}))
		}
		cancel()
		if err != nil {
			return int(n), newCallError(lc.method, "", c.endpoint, c.path, err)
		}
	}
	return int(n), nil
}
