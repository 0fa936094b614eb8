package unixgrpc

import (
	"sync"
	"time"

	"google.golang.org/grpc"
)

// StopAll stops every server at once, each gracefully (its calls finish)
// for at most timeout, then at once (its calls are cancelled), and returns
// when all have stopped.
func StopAll(servers []*grpc.Server, timeout time.Duration) {
	var stopped sync.WaitGroup
	for _, g := range servers {
		stopped.Go(func() {
			done := make(chan struct{})
			go func() {
				g.GracefulStop()
				close(done)
			}()
			t := time.NewTimer(timeout)
			defer t.Stop()
			select {
			case <-done:
			case <-t.C:
				g.Stop()
				<-done
			}
		})
	}
	stopped.Wait()
}
