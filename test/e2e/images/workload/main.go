// Command workload is the only binary in the e2e test images. It is built
// static (CGO_ENABLED=0) and placed at /workload in both images:
//
//	docker.io/pleg/pause:e2e     Entrypoint ["/workload"], Cmd ["pause"]
//	docker.io/pleg/workload:e2e  Entrypoint ["/workload"], Cmd ["run"]
//
// Modes (the first argument):
//
//	pause         sleep forever; exit 0 on SIGTERM or SIGINT (sandbox "pause")
//	run           same as pause, but meant for workload containers
//	sleep <dur>   sleep for a Go duration (e.g. 2s), then exit 0; SIGTERM/SIGINT exit 0 early
//	exit <code>   exit immediately with the given code
//	exit <code> <dur>  run for a Go duration (SIGTERM/SIGINT end it early), then exit with the code
//
// With no argument it behaves as pause. Each mode prints one line to stdout
// when it starts, so container logs show something.
//
// The program runs as PID 1 in its container, where the kernel ignores
// signals that have no handler; that is why every waiting mode installs one.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	mode := "pause"
	if len(args) > 0 {
		mode = args[0]
	}
	switch mode {
	case "pause", "run":
		fmt.Printf("workload: %s pid=%d\n", mode, os.Getpid())
		return waitSignal(nil)
	case "sleep":
		if len(args) != 2 {
			return usage("sleep needs a duration")
		}
		d, err := time.ParseDuration(args[1])
		if err != nil {
			return usage(err.Error())
		}
		fmt.Printf("workload: sleep %s pid=%d\n", d, os.Getpid())
		return waitSignal(time.After(d))
	case "exit":
		if len(args) != 2 && len(args) != 3 {
			return usage("exit needs a code (and optionally a delay)")
		}
		code, err := strconv.Atoi(args[1])
		if err != nil || code < 0 || code > 255 {
			return usage("exit code must be 0..255")
		}
		if len(args) == 3 {
			d, err := time.ParseDuration(args[2])
			if err != nil {
				return usage(err.Error())
			}
			fmt.Printf("workload: exit %d after %s pid=%d\n", code, d, os.Getpid())
			waitSignal(time.After(d))
			return code
		}
		fmt.Printf("workload: exit %d\n", code)
		return code
	default:
		return usage("unknown mode " + strconv.Quote(mode))
	}
}

// waitSignal blocks until SIGTERM/SIGINT arrives (returns 0) or done fires
// (returns 0). A nil done waits for a signal only.
func waitSignal(done <-chan time.Time) int {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	select {
	case s := <-sigs:
		fmt.Printf("workload: got %s, exiting\n", s)
	case <-done:
		fmt.Println("workload: done")
	}
	return 0
}

func usage(msg string) int {
	fmt.Fprintf(os.Stderr, "workload: %s\nusage: workload [pause|run|sleep DURATION|exit CODE]\n", msg)
	return 2
}
