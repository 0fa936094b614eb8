package main

import (
	"fmt"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"
)

func init() { register(newVersionCmd) }

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print pleg's version, the commit it was built from and the Go toolchain",
		Long: `version prints one line: the module version the Go toolchain stamped into
the binary (from the version control tag or commit it was built at), the
commit and whether the tree had local changes, the Go version and
platform, and the build tags (deploy/Dockerfile builds with grpcnotrace),
e.g.

  pleg v0.0.0-20261123121500-9eef660d1a2b (commit 9eef660d1a2b…, go1.26.8 linux/amd64, tags grpcnotrace)`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			bi, ok := debug.ReadBuildInfo()
			if !ok {
				return fmt.Errorf("the binary carries no build information")
			}
			fmt.Fprintln(cmd.OutOrStdout(), versionLine(bi))
			return nil
		},
	}
}

// versionLine formats a binary's build information as `pleg version`
// prints it.
func versionLine(bi *debug.BuildInfo) string {
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	var details []string
	if rev := settings["vcs.revision"]; rev != "" {
		c := "commit " + rev
		if settings["vcs.modified"] == "true" {
			c += " with local changes"
		}
		details = append(details, c)
	}
	platform := bi.GoVersion
	if os, arch := settings["GOOS"], settings["GOARCH"]; os != "" && arch != "" {
		platform += " " + os + "/" + arch
	}
	details = append(details, platform)
	if tags := settings["-tags"]; tags != "" {
		details = append(details, "tags "+tags)
	}
	v := bi.Main.Version
	if v == "" {
		v = "(devel)"
	}
	return fmt.Sprintf("pleg %s (%s)", v, strings.Join(details, ", "))
}
