// Command hog keeps a machine busy for test/load.sh: -cpu N goroutines
// spin on the CPU (at normal priority, so the tests under load compete
// with them), and with -io it also writes and fsyncs files in -dir, until
// SIGINT or SIGTERM, or -for elapses. It prints one line when it starts
// and one when it stops, with the work it did.
package main

import (
	"context"
	"crypto/sha256"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

func main() {
	cpus := flag.Int("cpu", runtime.NumCPU(), "goroutines spinning on the CPU (0: none)")
	io := flag.Bool("io", false, "also write and fsync 1 MiB files in -dir, one at a time")
	dir := flag.String("dir", os.TempDir(), "directory for -io's files (a subdirectory of it is made and removed)")
	dur := flag.Duration("for", 0, "stop after this long (0: only at SIGINT/SIGTERM)")
	flag.Parse()
	if *cpus < 0 || *cpus > 1024 {
		fmt.Fprintln(os.Stderr, "hog: -cpu must be from 0 to 1024")
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if *dur > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *dur)
		defer cancel()
	}
	runtime.GOMAXPROCS(max(*cpus, 1) + 1)

	var spins, writes atomic.Int64
	var wg sync.WaitGroup
	for range *cpus {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 4096)
			for ctx.Err() == nil {
				for range 64 {
					sum := sha256.Sum256(buf)
					buf[0] = sum[0]
				}
				spins.Add(1)
			}
		}()
	}
	var ioErr error
	if *io {
		d, err := os.MkdirTemp(*dir, "pleg-hog-")
		if err != nil {
			fmt.Fprintln(os.Stderr, "hog:", err)
			os.Exit(1)
		}
		defer os.RemoveAll(d)
		wg.Add(1)
		go func() {
			defer wg.Done()
			block := make([]byte, 1<<20)
			for i := 0; ctx.Err() == nil; i++ {
				p := filepath.Join(d, fmt.Sprintf("f%d", i%8))
				if err := writeSync(p, block); err != nil {
					ioErr = err
					return
				}
				writes.Add(1)
			}
		}()
	}
	start := time.Now()
	fmt.Printf("hog: %d CPU spinners, io %v, pid %d\n", *cpus, *io, os.Getpid())
	<-ctx.Done()
	wg.Wait()
	fmt.Printf("hog: stopped after %v: %d spin rounds, %d MiB written and synced\n",
		time.Since(start).Round(time.Millisecond), spins.Load(), writes.Load())
	if ioErr != nil {
		fmt.Fprintln(os.Stderr, "hog: io:", ioErr)
		os.Exit(1)
	}
}

func writeSync(path string, b []byte) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
