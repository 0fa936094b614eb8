package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"
)

// commands holds the constructors of every subcommand; each command's file
// registers itself in an init function.
var commands []func() *cobra.Command

func register(newCmd func() *cobra.Command) { commands = append(commands, newCmd) }

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "pleg",
		Short: "A standalone Pod Lifecycle Event Generator for Kubernetes nodes",
		Long: `pleg relists pods and containers from a CRI container runtime, turns the
differences into pod lifecycle events (ContainerStarted, ContainerDied,
ContainerRemoved, PodSync), keeps a pod status cache and reports health with
the kubelet's exact semantics.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	// klog's flags (-v and friends) on every command.
	gofs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(gofs)
	gofs.VisitAll(func(f *flag.Flag) {
		if f.Name == "v" || f.Name == "vmodule" || f.Name == "logtostderr" || f.Name == "add_dir_header" {
			root.PersistentFlags().AddGoFlag(f)
		}
	})
	if f := root.PersistentFlags().Lookup("v"); f != nil {
		// Kubernetes' components log at levels 0 to 10.
		f.Value = &levelFlag{Value: f.Value, max: 10}
		f.Shorthand = "v"
		f.Usage = "log verbosity (kubelet levels: 2 state changes, 4 per-event detail, 5/6 per relist)"
	}
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return usageError{err}
	})
	for _, newCmd := range commands {
		root.AddCommand(newCmd())
	}
	return root
}

// execute runs the command line and returns the process exit code: 0 on
// success, 2 for bad flags or arguments, 1 for any other failure.
func execute(args []string) int {
	root := newRootCmd()
	root.SetArgs(args)
	err := root.Execute()
	klog.Flush()
	if err == nil {
		return 0
	}
	var ce exitCodeError
	if errors.As(err, &ce) && ce.err == nil {
		return ce.code // the command said all it had to say
	}
	fmt.Fprintf(os.Stderr, "pleg: %v\n", err)
	var ue usageError
	if errors.As(err, &ue) || isCobraUsageError(err) {
		return 2
	}
	if errors.As(err, &ce) {
		return ce.code
	}
	return 1
}

// exitCodeError carries a specific exit code (for example `pleg check`).
type exitCodeError struct {
	code int
	err  error
}

func (e exitCodeError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}
func (e exitCodeError) Unwrap() error { return e.err }

func isCobraUsageError(err error) bool {
	// cobra reports unknown commands and bad argument counts as plain errors.
	msg := err.Error()
	for _, p := range []string{"unknown command", "accepts ", "requires at least", "unknown flag", "unknown shorthand flag"} {
		if strings.Contains(msg, p) {
			return true
		}
	}
	return false
}
