package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/podlifecycle/pleg"
	"github.com/podlifecycle/pleg/api/lifecycle/client"
	lifecyclev1 "github.com/podlifecycle/pleg/api/lifecycle/v1"
	"github.com/podlifecycle/pleg/internal/textfmt"
)

func init() { register(newWatchCmd) }

func newWatchCmd() *cobra.Command {
	rf := &runtimeFlags{}
	of := &outputFlag{}
	var daemon string
	cmd := &cobra.Command{
		Use:   "watch",
		Short: "Print pod lifecycle events as the runtime's pods change",
		Long: `watch runs a Pod Lifecycle Event Generator against a CRI runtime and prints
every event it delivers, one a line, on stdout: first the events that bring
an empty view up to the runtime's current state, then each change.

  --output text   time, type, namespace/name, container, container ID, exit code
  --output json   one JSON object a line: time, type, podUID, podName,
                  podNamespace, containerID (absent for PodSync), and
                  containerName and exitCode when known

Logs go to stderr. The runtime must be reachable at start (exit code 1 if
not); after that, an unreachable runtime is retried on every relist.
SIGINT or SIGTERM stops it with exit code 0.

With --daemon, watch makes no runtime call: it prints the events of a
running pleg run from its lifecycle API (a unix socket path such as
/run/pleg/pleg.sock, or a loopback host:port), reconnecting and resuming by
cursor when the connection drops; the runtime flags are then not used.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if daemon != "" {
				return runWatchDaemon(cmd, daemon, of)
			}
			return runWatch(cmd, rf, of)
		},
	}
	rf.addFlags(cmd.Flags())
	of.addFlags(cmd.Flags())
	cmd.Flags().StringVar(&daemon, "daemon", "",
		"print the events of a running pleg run from its lifecycle API (e.g. /run/pleg/pleg.sock) instead of relisting the runtime")
	return cmd
}

func runWatch(cmd *cobra.Command, rf *runtimeFlags, of *outputFlag) error {
	if err := rf.validate(); err != nil {
		return err
	}
	ctx, stop := signalContext(cmd)
	defer stop()

	d, err := newDaemon(rf, daemonOptions{})
	if err != nil {
		return err
	}
	vctx, cancel := context.WithTimeout(ctx, rf.dialTimeout())
	name, version, err := d.client.Version(vctx)
	cancel()
	if err != nil {
		_ = d.client.Close()
		if ctx.Err() != nil {
			return nil // interrupted while connecting
		}
		return reachError(rf.endpoint, rf.dialTimeout(), err)
	}
	d.log.V(1).Info("Connected to the container runtime", "endpoint", rf.endpoint,
		"runtimeName", name, "runtimeVersion", version)

	// Subscribe before the first relist: the first update is an empty
	// resync, then every event of the runtime's current state follows.
	sub := d.gen.Subscribe()
	d.start(ctx)
	defer d.stop()

	out := bufio.NewWriter(cmd.OutOrStdout())
	print := textEventPrinter
	if of.format == "json" {
		print = jsonEventPrinter
	}
	first := true
	for {
		u, err := sub.Next(ctx)
		if err != nil {
			if errors.Is(err, pleg.ErrClosed) || ctx.Err() != nil {
				return nil
			}
			return err
		}
		if u.Resync {
			// Not an event: stdout carries events only.
			if first {
				d.log.V(4).Info("Subscribed to lifecycle events", "pods", len(u.Pods))
			} else {
				d.log.Info("Fell behind the event stream; events were skipped and the view was resynced", "pods", len(u.Pods))
			}
			first = false
			continue
		}
		first = false
		if err := print(out, u.Event); err != nil {
			return err
		}
		if err := out.Flush(); err != nil {
			return fmt.Errorf("writing events: %w", err)
		}
	}
}

// runWatchDaemon prints the events of a daemon's lifecycle stream.
func runWatchDaemon(cmd *cobra.Command, address string, of *outputFlag) error {
	ctx, stop := signalContext(cmd)
	defer stop()
	log := klog.Background()
	c, err := client.New(client.Options{Address: address, Logger: log.WithName("lifecycle")})
	if err != nil {
		return usageErrorf("invalid --daemon %q: %v", address, err)
	}
	defer c.Close()
	out := bufio.NewWriter(cmd.OutOrStdout())
	print := textEventPrinter
	if of.format == "json" {
		print = jsonEventPrinter
	}
	var werr error
	first := true
	err = c.Run(ctx, client.HandlerFuncs{
		Resync: func(pods []*lifecyclev1.Pod, _ client.Position) {
			// Not an event: stdout carries events only.
			if first {
				log.V(1).Info("Watching pleg's lifecycle stream", "address", address, "pods", len(pods))
			} else {
				log.Info("pleg asked for a resync (it restarted, or the watch fell behind its journal); events of the gap are not printed", "pods", len(pods))
			}
			first = false
		},
		Event: func(ev *lifecyclev1.PodEvent, at client.Position) {
			for _, e := range plegEvents(ev, at.Time) {
				if werr == nil {
					werr = print(out, e)
				}
			}
			if werr == nil {
				werr = out.Flush()
			}
			if werr != nil {
				stop()
			}
		},
		RuntimeStatus: func(st *lifecyclev1.RuntimeStatus, _ client.Position) {
			log.Info("The container runtime's status changed", "state", st.GetState().String(), "message", st.GetMessage())
		},
	})
	if werr != nil {
		return fmt.Errorf("writing events: %w", werr)
	}
	return err
}

// plegEvents are the kubelet-style events of a stream's pod event: one a
// transition (PodUpdated, which fills in optional fields, is none).
func plegEvents(ev *lifecyclev1.PodEvent, at time.Time) []pleg.Event {
	var out []pleg.Event
	for _, t := range ev.GetTransitions() {
		var typ pleg.EventType
		switch t.GetType() {
		case lifecyclev1.EventType_CONTAINER_STARTED:
			typ = pleg.ContainerStarted
		case lifecyclev1.EventType_CONTAINER_DIED:
			typ = pleg.ContainerDied
		case lifecyclev1.EventType_CONTAINER_REMOVED:
			typ = pleg.ContainerRemoved
		case lifecyclev1.EventType_POD_SYNC:
			typ = pleg.PodSync
		default:
			continue
		}
		e := pleg.Event{Time: at, Type: typ, PodUID: types.UID(ev.GetPod().GetUid()), PodName: ev.GetPod().GetName(),
			PodNamespace: ev.GetPod().GetNamespace(), ContainerID: t.GetContainerId(), ContainerName: t.GetContainerName(),
			Sandbox: t.GetSandbox()}
		if t.ExitCode != nil {
			code := t.GetExitCode()
			e.ExitCode = &code
		}
		out = append(out, e)
	}
	return out
}

// jsonEventPrinter writes one event as one line of JSON (pleg.Event's form).
func jsonEventPrinter(w io.Writer, e pleg.Event) error {
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// Column widths of the text output. Longer values are printed whole and
// push the rest of their line right.
const (
	textTimeLayout  = "2006-01-02T15:04:05.000Z07:00"
	textTypeWidth   = len("ContainerStarted")
	textPodWidth    = 40
	textNameWidth   = 24
	sandboxNameText = "(sandbox)"
)

// textEventPrinter writes one event as an aligned line:
//
//	2026-01-02T15:04:05.000Z  ContainerDied     default/web-0    nginx   0f3c9a1b2d4e5  3
func textEventPrinter(w io.Writer, e pleg.Event) error {
	name := e.ContainerName
	if e.Sandbox {
		name = sandboxNameText
	}
	if e.Type == pleg.PodSync {
		name = "-"
	}
	id := textfmt.ShortID(e.ContainerID)
	if id == "" {
		id = "-"
	}
	code := "-"
	if e.ExitCode != nil {
		code = strconv.Itoa(int(*e.ExitCode))
	}
	_, err := fmt.Fprintf(w, "%-24s  %-*s  %-*s  %-*s  %-*s  %s\n",
		e.Time.UTC().Format(textTimeLayout),
		textTypeWidth, e.Type,
		textPodWidth, e.Pod(),
		textNameWidth, name,
		textfmt.ShortIDLen, id,
		code)
	return err
}
